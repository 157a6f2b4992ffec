//go:build linux

package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

const mosquittoName = "mosquitto QoS 1, no persistence"

// mqttRun is the detail of one fleet size.
type mqttRun struct {
	Gateway         loadResult          `json:"gatewayd"`
	Mosquitto       loadResult          `json:"mosquitto"`
	GatewayPrime    primeResult         `json:"gatewayd_first_batches"`
	MosquittoPrime  primeResult         `json:"mosquitto_first_batches"`
	ConnectedMemory memory              `json:"gatewayd_memory_devices_connected"`
	GatewayCommits  commitStats         `json:"gatewayd_commits"`
	FreshMemory     memory              `json:"gatewayd_memory_no_device"`
	IdleMemory      memory              `json:"gatewayd_memory_devices_idle"`
	LoadedMemory    memory              `json:"gatewayd_memory_after_load"`
	MosquittoMemory memory              `json:"mosquitto_memory_after_load"`
	GoMemory        map[string]goMemory `json:"gatewayd_go_memory"`
	PendingBatches  float64             `json:"gatewayd_pending_batches_after"`
	DataDir         diskUsage           `json:"gatewayd_data_dir_after"`
}

// mqtt runs the closed-loop MQTT load with n devices against gatewayd, then
// against mosquitto.
func (r *runner) mqtt(ctx context.Context, n int) error {
	section := fmt.Sprintf("mqtt %d devices", n)
	run := mqttRun{GoMemory: map[string]goMemory{}}
	largest := n == r.cfg.maxDevices()
	goMem := func(g *gatewayd, at string) error {
		m, err := g.goMemory(ctx)
		run.GoMemory[at] = m
		if err != nil {
			return err
		}
		// Kept with --keep-work, for go tool pprof.
		return g.saveHeapProfile(ctx, filepath.Join(r.work,
			fmt.Sprintf("heap-mqtt-%d-%s.pb.gz", n, strings.ReplaceAll(at, " ", "-"))))
	}

	r.log.Info("mqtt: gatewayd", "devices", n, "inflight", r.cfg.Inflight, "duration", r.cfg.Duration)
	g, dir, err := r.startIngestGateway(ctx, fmt.Sprintf("mqtt-%d", n))
	if err != nil {
		return err
	}
	defer g.proc.Kill()
	sleepCtx(ctx, time.Second)
	if run.FreshMemory, err = procMemory(g.pid()); err != nil {
		return err
	}
	if err := goMem(g, "no device"); err != nil {
		return err
	}
	f, err := connectFleet(ctx, fleetSpec{addr: g.mqttAddr, fleet: r.nextFleet(), devices: n,
		readings: r.cfg.Readings, key: r.key, waitAck: true})
	if err != nil {
		return err
	}
	sleepCtx(ctx, 2*time.Second)
	if run.ConnectedMemory, err = procMemory(g.pid()); err != nil {
		return err
	}
	if err := goMem(g, "devices connected"); err != nil {
		return err
	}
	if run.GatewayPrime, err = f.prime(ctx); err != nil {
		return err
	}
	sleepCtx(ctx, 2*time.Second)
	if run.IdleMemory, err = procMemory(g.pid()); err != nil {
		return err
	}
	if err := goMem(g, "devices idle"); err != nil {
		return err
	}
	var hooks []loadHooks
	var prof *perfRecord
	if r.cfg.Profile && largest {
		prof = &perfRecord{pid: g.pid(), seconds: r.cfg.Duration, data: filepath.Join(r.work, "gatewayd-mqtt.perf.data")}
		hooks = append(hooks, prof.hooks())
	}
	var cpuProf *pprofCPU
	if r.cfg.CPUProfileDir != "" {
		cpuProf = &pprofCPU{g: g, seconds: r.cfg.Duration, path: filepath.Join(r.cfg.CPUProfileDir, fmt.Sprintf("cpu-mqtt-%d.pb.gz", n))}
		hooks = append(hooks, cpuProf.hooks())
	}
	if run.Gateway, run.GatewayCommits, err = r.closedLoopGateway(ctx, g, f, hooks...); err != nil {
		return err
	}
	if run.LoadedMemory, err = procMemory(g.pid()); err != nil {
		return err
	}
	if err := goMem(g, "after load"); err != nil {
		return err
	}
	after, err := g.metrics(ctx)
	if err != nil {
		return err
	}
	run.PendingBatches = after.sum("gateway_buffer_pending_batches")
	if run.DataDir, err = dirUsage(dir); err != nil {
		return err
	}
	if err := g.stop(); err != nil {
		return err
	}
	if cpuProf != nil {
		if cpuProf.err != nil {
			r.res.note("CPU profile not saved: %v", cpuProf.err)
		} else {
			r.res.note("Go CPU profile of gatewayd during the %d-device MQTT run: %s", n, cpuProf.path)
		}
	}
	if prof != nil {
		if err := prof.report(r.cfg.ProfileOut); err != nil {
			r.res.note("perf profile not recorded: %v", err)
		} else {
			r.res.note("perf profile of gatewayd during the %d-device MQTT run: %s", n, r.cfg.ProfileOut)
		}
	}
	if largest {
		r.liveDisk = &liveDisk{Usage: run.DataDir, Readings: int64(run.PendingBatches) * int64(r.cfg.Readings)}
	}

	r.log.Info("mqtt: mosquitto", "devices", n)
	mq, err := startMosquitto(r.work)
	if err != nil {
		return err
	}
	defer mq.proc.Kill()
	f, err = connectFleet(ctx, fleetSpec{addr: mq.addr, fleet: r.nextFleet(), devices: n, readings: r.cfg.Readings})
	if err != nil {
		return err
	}
	if run.MosquittoPrime, err = f.prime(ctx); err != nil {
		return err
	}
	mcpu := &cpuMark{pid: mq.proc.Pid()}
	mself := &cpuMark{pid: os.Getpid()}
	run.Mosquitto, err = f.closedLoop(ctx, r.cfg.Inflight, r.cfg.Warmup, r.cfg.Duration, mcpu.hooks(mself.hooks()))
	f.disconnect()
	if err != nil {
		return err
	}
	if mcpu.err != nil {
		return mcpu.err
	}
	run.Mosquitto.ServerCPU = mcpu.seconds()
	run.Mosquitto.ClientCPU = mself.seconds()
	if run.MosquittoMemory, err = procMemory(mq.proc.Pid()); err != nil {
		return err
	}
	if err := mq.stop(); err != nil {
		return err
	}
	r.res.Details[section] = run

	gw, mo := run.Gateway, run.Mosquitto
	r.res.add(section, "durable ingest (ack topic, accepted)", "batches/s", gw.BatchesPerSec, mo.BatchesPerSec, "mosquitto PUBACKs/s", ratioAtLeast(0.5))
	r.res.add(section, "durable ingest", "readings/s", gw.ReadingsPerSec, mo.ReadingsPerSec, "mosquitto", nil)
	r.res.add(section, "ack p50, publish -> ack-topic message", "ms", gw.Ack.P50, mo.Puback.P50, "mosquitto PUBACK p50", nil)
	r.res.add(section, "ack p99, publish -> ack-topic message", "ms", gw.Ack.P99, mo.Puback.P99, "mosquitto PUBACK p99", nil)
	r.res.add(section, "PUBACK p50, publish -> PUBACK", "ms", gw.Puback.P50, mo.Puback.P50, "mosquitto PUBACK p50", nil)
	r.res.add(section, "PUBACK p99, publish -> PUBACK", "ms", gw.Puback.P99, mo.Puback.P99, "mosquitto PUBACK p99", below(20, "ms"))
	r.res.add(section, "first batch of every device at once (new boot_id): all acked after", "s",
		run.GatewayPrime.Seconds, run.MosquittoPrime.Seconds, "mosquitto", nil)
	r.res.add("footprint", fmt.Sprintf("RSS, %d devices connected, idle", n), "MB", mb(run.IdleMemory.RSS), mb(run.FreshMemory.RSS),
		"gatewayd, no device", atMost(64, "MB"))
	r.res.add("footprint", fmt.Sprintf("RSS after the load, MQTT %d devices (%s readings pending)", n,
		count(int(run.PendingBatches)*r.cfg.Readings)), "MB", mb(run.LoadedMemory.RSS), mb(run.FreshMemory.RSS), "gatewayd, no device", nil)
	r.res.add("footprint", fmt.Sprintf("CPU per 10k readings, MQTT %d devices", n), "CPU s",
		perReading10k(gw.ServerCPU, gw.ReadingsPerSec*gw.WindowSeconds),
		perReading10k(mo.ServerCPU, mo.ReadingsPerSec*mo.WindowSeconds), "mosquitto", nil)
	r.checkLoad(section+", gatewayd", gw)
	r.checkLoad(section+", mosquitto", mo)
	r.res.note("%s: gatewayd committed %.0f groups/s of %.1f batches on average, %.2f ms each (group commit + fsync)%s",
		section, run.GatewayCommits.CommitsPerSec, run.GatewayCommits.AvgGroupBatches, run.GatewayCommits.AvgCommitMS,
		run.GatewayCommits.inside())
	return nil
}

// closedLoopGateway runs the closed-loop load of fleet f on gatewayd g,
// disconnects the fleet, and returns the load with gatewayd's and the load
// generator's CPU time and gatewayd's group commits over the measured
// window. extra hooks run at the window's edges too.
func (r *runner) closedLoopGateway(ctx context.Context, g *gatewayd, f *fleet, extra ...loadHooks) (loadResult, commitStats, error) {
	cpu := &cpuMark{pid: g.pid()}
	met := &metricsMark{g: g, ctx: ctx}
	self := &cpuMark{pid: os.Getpid()}
	hooks := append(append([]loadHooks{met.hooks()}, extra...), self.hooks())
	res, err := f.closedLoop(ctx, r.cfg.Inflight, r.cfg.Warmup, r.cfg.Duration, cpu.hooks(hooks...))
	f.disconnect()
	if err != nil {
		return res, commitStats{}, err
	}
	if err := errors.Join(cpu.err, met.err, self.err); err != nil {
		return res, commitStats{}, err
	}
	res.ServerCPU = cpu.seconds()
	res.ClientCPU = self.seconds()
	return res, met.commits(res.WindowSeconds, "mqtt"), nil
}

// checkLoad notes errors and answers other than "accepted".
func (r *runner) checkLoad(what string, l loadResult) {
	if l.Errors > 0 || l.LostConns > 0 || l.Skipped > 0 {
		r.res.note("%s: %d errors (no PUBACK or ack within %s), %d lost connections, %d sends skipped (open loop, %d in flight)",
			what, l.Errors, answerTimeout, l.LostConns, l.Skipped, maxOutstanding)
	}
	for status, n := range l.Answers {
		if status != "accepted" {
			r.res.note("%s: %d answers %q", what, n, status)
		}
	}
}

// fixedRun is the detail of the fixed-rate scenario.
type fixedRun struct {
	Gateway        loadResult  `json:"gatewayd"`
	Mosquitto      loadResult  `json:"mosquitto"`
	GatewayCommits commitStats `json:"gatewayd_commits"`
}

// fixed offers FixedRate batches/s from the largest fleet, open loop.
// fixed offers r.cfg.FixedRate batches/s from each fleet size.
func (r *runner) fixed(ctx context.Context) error {
	for _, n := range r.cfg.Devices {
		if err := r.fixedFleet(ctx, n); err != nil {
			return fmt.Errorf("%d devices: %w", n, err)
		}
	}
	return nil
}

func (r *runner) fixedFleet(ctx context.Context, n int) error {
	section := fmt.Sprintf("fixed %g batches/s, %d devices", r.cfg.FixedRate, n)
	var run fixedRun
	r.log.Info("fixed rate: gatewayd", "rate", r.cfg.FixedRate, "devices", n)
	g, _, err := r.startIngestGateway(ctx, fmt.Sprintf("fixed-%d", n))
	if err != nil {
		return err
	}
	defer g.proc.Kill()
	f, err := connectFleet(ctx, fleetSpec{addr: g.mqttAddr, fleet: r.nextFleet(), devices: n,
		readings: r.cfg.Readings, key: r.key, waitAck: true})
	if err != nil {
		return err
	}
	if _, err := f.prime(ctx); err != nil {
		return err
	}
	cpu := &cpuMark{pid: g.pid()}
	met := &metricsMark{g: g, ctx: ctx}
	run.Gateway, err = f.openLoop(ctx, r.cfg.FixedRate, r.cfg.Warmup, r.cfg.Duration, cpu.hooks(met.hooks()))
	f.disconnect()
	if err != nil {
		return err
	}
	if err := errors.Join(cpu.err, met.err); err != nil {
		return err
	}
	run.Gateway.ServerCPU = cpu.seconds()
	run.GatewayCommits = met.commits(run.Gateway.WindowSeconds, "mqtt")
	if err := g.stop(); err != nil {
		return err
	}

	r.log.Info("fixed rate: mosquitto", "rate", r.cfg.FixedRate, "devices", n)
	mq, err := startMosquitto(r.work)
	if err != nil {
		return err
	}
	defer mq.proc.Kill()
	f, err = connectFleet(ctx, fleetSpec{addr: mq.addr, fleet: r.nextFleet(), devices: n, readings: r.cfg.Readings})
	if err != nil {
		return err
	}
	if _, err := f.prime(ctx); err != nil {
		return err
	}
	mcpu := &cpuMark{pid: mq.proc.Pid()}
	run.Mosquitto, err = f.openLoop(ctx, r.cfg.FixedRate, r.cfg.Warmup, r.cfg.Duration, mcpu.hooks())
	f.disconnect()
	if err != nil {
		return err
	}
	run.Mosquitto.ServerCPU = mcpu.seconds()
	if err := mq.stop(); err != nil {
		return err
	}
	r.res.Details[section] = run

	gw, mo := run.Gateway, run.Mosquitto
	r.res.add(section, "ack p99, publish -> ack-topic message", "ms", gw.Ack.P99, mo.Puback.P99, "mosquitto PUBACK p99", below(20, "ms"))
	r.res.add(section, "ack p50, publish -> ack-topic message", "ms", gw.Ack.P50, mo.Puback.P50, "mosquitto PUBACK p50", nil)
	r.res.add(section, "PUBACK p99, publish -> PUBACK", "ms", gw.Puback.P99, mo.Puback.P99, "mosquitto PUBACK p99", below(20, "ms"))
	r.res.add(section, "achieved (acks in window)", "batches/s", gw.BatchesPerSec, mo.BatchesPerSec, "mosquitto", nil)
	r.checkLoad(section+", gatewayd", gw)
	r.checkLoad(section+", mosquitto", mo)
	r.res.note("%s: %d devices, one batch every %s each, random phases; latency from the scheduled send time; "+
		"gatewayd committed %.0f groups/s of %.1f batches, %.2f ms each%s",
		section, n, time.Duration(float64(time.Second)*float64(n)/r.cfg.FixedRate), run.GatewayCommits.CommitsPerSec,
		run.GatewayCommits.AvgGroupBatches, run.GatewayCommits.AvgCommitMS, run.GatewayCommits.inside())
	return nil
}

// httpRun is the detail of the HTTP scenario.
type httpRun struct {
	Gateway        httpResult  `json:"gatewayd"`
	Discard        httpResult  `json:"discard_handler"`
	GatewayCommits commitStats `json:"gatewayd_commits"`
}

func (r *runner) http(ctx context.Context) error {
	section := fmt.Sprintf("http %d clients", r.cfg.HTTPClients)
	var run httpRun
	r.log.Info("http: gatewayd", "clients", r.cfg.HTTPClients)
	g, _, err := r.startIngestGateway(ctx, "http")
	if err != nil {
		return err
	}
	defer g.proc.Kill()
	cpu := &cpuMark{pid: g.pid()}
	met := &metricsMark{g: g, ctx: ctx}
	run.Gateway, err = httpLoad(ctx, "http://"+g.httpAddr+"/v1/readings", r.key, r.nextFleet(), r.cfg.HTTPClients,
		r.cfg.Readings, r.cfg.Warmup, r.cfg.Duration, cpu.hooks(met.hooks()))
	if err != nil {
		return err
	}
	if err := errors.Join(cpu.err, met.err); err != nil {
		return err
	}
	run.Gateway.ServerCPU = cpu.seconds()
	run.GatewayCommits = met.commits(run.Gateway.WindowSeconds, "http")
	if err := g.stop(); err != nil {
		return err
	}

	r.log.Info("http: discard handler", "clients", r.cfg.HTTPClients)
	ds, err := startDiscardServer(filepath.Join(r.work, "discard-server.log"))
	if err != nil {
		return err
	}
	defer ds.proc.Kill()
	dcpu := &cpuMark{pid: ds.proc.Pid()}
	run.Discard, err = httpLoad(ctx, "http://"+ds.addr+"/v1/readings", r.key, r.nextFleet(), r.cfg.HTTPClients,
		r.cfg.Readings, r.cfg.Warmup, r.cfg.Duration, dcpu.hooks())
	if err != nil {
		return err
	}
	run.Discard.ServerCPU = dcpu.seconds()
	if err := ds.stop(); err != nil {
		return err
	}
	r.res.Details[section] = run

	gw, d := run.Gateway, run.Discard
	const base = "Go handler discarding the body"
	r.res.add(section, "durable ingest, one batch per POST", "batches/s", gw.BatchesPerSec, d.BatchesPerSec, base, nil)
	r.res.add(section, "latency p50", "ms", gw.Latency.P50, d.Latency.P50, base, nil)
	r.res.add(section, "latency p99", "ms", gw.Latency.P99, d.Latency.P99, base, nil)
	readings := func(h httpResult) float64 { return h.BatchesPerSec * h.WindowSeconds * float64(r.cfg.Readings) }
	r.res.add("footprint", "CPU per 10k readings, HTTP", "CPU s", perReading10k(gw.ServerCPU, readings(gw)),
		perReading10k(d.ServerCPU, readings(d)), base, nil)
	for _, h := range []struct {
		what string
		res  httpResult
	}{{"gatewayd", gw}, {"discard handler", d}} {
		for code, n := range h.res.Codes {
			if code != "200" {
				r.res.note("%s, %s: %d answers %s", section, h.what, n, code)
			}
		}
	}
	r.res.note("%s: gatewayd committed %.0f groups/s of %.1f batches on average, %.2f ms each%s",
		section, run.GatewayCommits.CommitsPerSec, run.GatewayCommits.AvgGroupBatches, run.GatewayCommits.AvgCommitMS,
		run.GatewayCommits.inside())
	return nil
}

// perfRecord records a process with perf for a window.
type perfRecord struct {
	pid     int
	seconds time.Duration
	data    string
	cmd     *exec.Cmd
	err     error
}

func (p *perfRecord) hooks() loadHooks {
	return loadHooks{
		start: func() {
			perf, err := exec.LookPath("perf")
			if err != nil {
				p.err = err
				return
			}
			p.cmd = exec.Command(perf, "record", "-q", "-F", "499", "-g", "-p", strconv.Itoa(p.pid),
				"-o", p.data, "--", "sleep", strconv.Itoa(int(p.seconds/time.Second)))
			p.err = p.cmd.Start()
		},
		end: func() {
			if p.cmd != nil && p.err == nil {
				done := make(chan error, 1)
				go func() { done <- p.cmd.Wait() }()
				select {
				case p.err = <-done:
				case <-time.After(30 * time.Second):
					_ = p.cmd.Process.Kill()
					p.err = errors.New("perf record did not finish")
				}
			}
		},
	}
}

// report writes perf's flat profile (self time by symbol) and call graph
// summary to out.
func (p *perfRecord) report(out string) error {
	if p.err != nil {
		return p.err
	}
	if out == "" {
		return errors.New("no profile output path")
	}
	cmd := exec.Command("perf", "report", "-i", p.data, "--stdio", "--no-children", "--sort", "symbol",
		"--percent-limit", "0.5", "-g", "none")
	flat, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("perf report: %w", err)
	}
	cmd = exec.Command("perf", "report", "-i", p.data, "--stdio", "--children", "--sort", "symbol",
		"--percent-limit", "2", "-g", "none")
	children, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("perf report --children: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o750); err != nil {
		return err
	}
	body := "# perf record -F 499 -g of gatewayd during the largest MQTT closed-loop run\n\n" +
		"## self time by symbol\n\n" + string(flat) + "\n## inclusive time (children) by symbol\n\n" + string(children)
	return os.WriteFile(out, []byte(body), 0o644)
}

// sleepCtx sleeps for d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) {
	sleepUntil(ctx, time.Now().Add(d))
}
