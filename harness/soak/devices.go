package soak

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"greenhouse-gateway/harness/devicesim"

	"greenhouse-gateway/harness/proc"
)

// fleet is the simulated devices of one scenario: two devicesim processes
// (cmd/devicesim, so that the soak and its test stay free of the MQTT
// client's own data races on reconnect, eclipse-paho/paho.mqtt.golang
// issue 703), one over MQTT with 5-reading batches (one TransactWriteItems
// each on DynamoDB Local) and reboots, one over HTTP with 12-reading
// batches (above DynamoDB Local's 10-action transactions: readings first,
// marker last). Each writes a report of the batches that got a final
// answer.
type fleet struct {
	sims []*sim
}

type sim struct {
	name    string
	proc    *proc.Process
	report  string
	logPath string
}

// fleetConfig sizes a fleet.
type fleetConfig struct {
	bin      string // the devicesim binary
	devices  int
	interval time.Duration
	load     time.Duration // how long devices produce batches
	drain    time.Duration // how long they then try to get the rest confirmed
	seed     uint64
	apiKey   string
	mqttURL  string
	httpURL  string
	dir      string
}

func startFleet(c fleetConfig) (*fleet, error) {
	mqttDevices := (c.devices + 1) / 2
	plans := []struct {
		name     string
		devices  int
		readings int
		firstMAC string
		args     []string
	}{
		{"mqtt", mqttDevices, 5, "02:50:00:00:01:00", []string{"--mqtt-url", c.mqttURL, "--reboot-every", "30s"}},
		{"http", c.devices - mqttDevices, 12, "02:50:00:00:02:00", []string{"--http-url", c.httpURL}},
	}
	fl := &fleet{}
	for i, p := range plans {
		if p.devices == 0 {
			continue
		}
		s := &sim{name: p.name, report: filepath.Join(c.dir, p.name+"-report.jsonl"),
			logPath: filepath.Join(c.dir, "devicesim-"+p.name+".log")}
		args := append([]string{
			"--devices", strconv.Itoa(p.devices), "--first-mac", p.firstMAC,
			"--interval", c.interval.String(), "--readings", strconv.Itoa(p.readings),
			"--duration", c.load.String(), "--drain-timeout", c.drain.String(),
			"--buffer-size", strconv.Itoa(devicesim.MaxBufferSize), // nothing dropped on overflow
			"--ack-timeout", "5s", "--seed", strconv.FormatUint(c.seed*16+uint64(i)+1, 10),
			"--report", s.report, "--summary-every", "0", "--log-level", "info",
		}, p.args...)
		logFile, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
		if err != nil {
			fl.stop()
			return nil, fmt.Errorf("opening the devices' log: %w", err)
		}
		cmd := exec.Command(c.bin, args...)
		cmd.Env = append(os.Environ(), "DEVICESIM_API_KEY="+c.apiKey)
		cmd.Stdout, cmd.Stderr = logFile, logFile
		s.proc, err = proc.Start("devicesim-"+p.name, cmd)
		logFile.Close()
		if err != nil {
			fl.stop()
			return nil, err
		}
		fl.sims = append(fl.sims, s)
	}
	return fl, nil
}

// wait waits at most timeout for every device to stop (load over, buffer
// confirmed or drain timeout passed) and reports a simulator that failed.
func (fl *fleet) wait(ctx context.Context, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	var errs []error
	for _, s := range fl.sims {
		select {
		case <-s.proc.Done():
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return fmt.Errorf("devicesim (%s) still running %s after its load ended", s.name, timeout)
		}
		if code := s.proc.ExitCode(); code != 0 {
			errs = append(errs, fmt.Errorf("devicesim (%s) %s:\n%s", s.name, s.proc.ExitDescription(), tail(s.logPath, 2048)))
		}
	}
	return errors.Join(errs...)
}

// stop ends the simulators still running: SIGTERM (they stop at once,
// without draining), then SIGKILL.
func (fl *fleet) stop() {
	for _, s := range fl.sims {
		if !s.proc.Exited() {
			_ = s.proc.Signal(syscall.SIGTERM)
		}
	}
	for _, s := range fl.sims {
		if !s.proc.Wait(10 * time.Second) {
			_ = s.proc.Kill()
		}
	}
}

// fleetStats are the devices' counters from the simulators' final summaries.
type fleetStats struct {
	built, sent, resent, accepted, duplicates, overflow, pending, reboots int
	summaries                                                             int
}

// results reads the report files and the final summaries, after wait.
func (fl *fleet) results() ([]devicesim.ReportLine, fleetStats, error) {
	var lines []devicesim.ReportLine
	var st fleetStats
	for _, s := range fl.sims {
		f, err := os.Open(s.report)
		if err != nil {
			return nil, st, err
		}
		ls, err := devicesim.ReadReport(f)
		f.Close()
		if err != nil {
			return nil, st, fmt.Errorf("%s: %w", s.report, err)
		}
		lines = append(lines, ls...)
		if err := s.summary(&st); err != nil {
			return nil, st, err
		}
	}
	return lines, st, nil
}

// summary adds the counters of the simulator's "final summary" log line.
func (s *sim) summary(st *fleetStats) error {
	f, err := os.Open(s.logPath)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	var last string
	for sc.Scan() {
		if strings.Contains(sc.Text(), `msg="final summary"`) {
			last = sc.Text()
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if last == "" {
		return fmt.Errorf("devicesim (%s) logged no final summary", s.name)
	}
	fields := map[string]*int{"built": &st.built, "sent": &st.sent, "resent": &st.resent, "accepted": &st.accepted,
		"duplicates": &st.duplicates, "overflow": &st.overflow, "pending": &st.pending, "reboots": &st.reboots}
	for _, kv := range strings.Fields(last) {
		k, v, ok := strings.Cut(kv, "=")
		if p := fields[k]; ok && p != nil {
			n, err := strconv.Atoi(v)
			if err != nil {
				return fmt.Errorf("devicesim (%s) final summary %s: %w", s.name, kv, err)
			}
			*p += n
		}
	}
	st.summaries++
	return nil
}
