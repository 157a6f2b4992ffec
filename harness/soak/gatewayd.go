package soak

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"greenhouse-gateway/harness/modroot"
	"greenhouse-gateway/harness/proc"
)

// gatewayd settings of a soak.
const (
	// pepper is the API key pepper of the soak's gateways and keys.
	pepper = "soak-pepper"
	// shutdownTimeout is gatewayd's shutdown_timeout: a SIGTERM must end
	// the process, with status 0, within it.
	shutdownTimeout = 15 * time.Second
	// readyTimeout bounds the wait for a (re)started gatewayd's /readyz.
	readyTimeout = 60 * time.Second
	// buildTimeout bounds go build.
	buildTimeout = 10 * time.Minute
)

// buildBinaries builds cmd/gatewayd (with -race if race) and cmd/devicesim
// into dir.
func buildBinaries(ctx context.Context, dir string, race bool) error {
	root, err := modroot.Find()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	for _, b := range []struct {
		pkg  string
		race bool
	}{{"./cmd/gatewayd", race}, {"./cmd/devicesim", false}} {
		args := []string{"build", "-o", dir + string(filepath.Separator)}
		if b.race {
			args = append(args, "-race")
		}
		cmd := exec.CommandContext(ctx, "go", append(args, b.pkg)...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %w\n%s", b.pkg, err, out)
		}
	}
	return nil
}

// gatewayd is the gateway under test: one binary, one data directory and
// fixed loopback ports that persist across its restarts, so that devices
// reconnect to the same address.
type gatewayd struct {
	bin      string
	dataDir  string
	endpoint string // DynamoDB, or the fault proxy
	prefix   string
	mqttAddr string
	httpAddr string
	logPath  string
	// writeModes are the uplink.write_mode values, taken in turn from
	// offset at each start; empty leaves gatewayd's default.
	writeModes []string
	offset     int
	// extra are settings of the scenario's own (GATEWAY_NAME=VALUE).
	extra []string
	// pprofAddr is debug.pprof_addr when a scenario sets it.
	pprofAddr string
	proc      *proc.Process
	starts    int
	mode      string // write mode of the current process
}

func newGatewayd(bin, dir, endpoint, prefix string) (*gatewayd, error) {
	mqttPort, err := pickPort()
	if err != nil {
		return nil, err
	}
	httpPort, err := pickPort()
	for err == nil && httpPort == mqttPort {
		httpPort, err = pickPort()
	}
	if err != nil {
		return nil, err
	}
	g := &gatewayd{
		bin: bin, dataDir: filepath.Join(dir, "gateway-data"), endpoint: endpoint, prefix: prefix,
		mqttAddr: "127.0.0.1:" + strconv.Itoa(mqttPort),
		httpAddr: "127.0.0.1:" + strconv.Itoa(httpPort),
		logPath:  filepath.Join(dir, "gatewayd.log"),
	}
	return g, nil
}

// environ is the process environment: the soak's own, without any GATEWAY_
// or AWS_ setting that could change the gateway under test, and with fast
// retries so that recoveries show within the soak.
func (g *gatewayd) environ(mode string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GATEWAY_") && !strings.HasPrefix(kv, "AWS_") {
			env = append(env, kv)
		}
	}
	env = append(env,
		"GATEWAY_API_KEY_PEPPER="+pepper,
		"AWS_ACCESS_KEY_ID=local", "AWS_SECRET_ACCESS_KEY=local", "AWS_REGION=us-east-1",
		"AWS_EC2_METADATA_DISABLED=true",
		"GATEWAY_UPLINK_MAX_BACKOFF=500ms", "GATEWAY_UPLINK_REQUEST_TIMEOUT=3s", "GATEWAY_UPLINK_POLL_INTERVAL=200ms",
		"GATEWAY_HTTP_RETRY_AFTER=1s", "GATEWAY_SHUTDOWN_TIMEOUT="+shutdownTimeout.String(),
		"GATEWAY_UPLINK_WRITE_MODE="+mode,
	)
	return append(env, g.extra...)
}

// start runs gatewayd and waits until /readyz answers 200.
func (g *gatewayd) start(ctx context.Context) error {
	logFile, err := os.OpenFile(g.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("opening %s: %w", g.logPath, err)
	}
	defer logFile.Close()
	g.starts++
	g.mode = ""
	if len(g.writeModes) > 0 {
		g.mode = g.writeModes[(g.offset+g.starts-1)%len(g.writeModes)]
	}
	fmt.Fprintf(logFile, "\n=== soak: start %d at %s, uplink write mode %q\n", g.starts, time.Now().Format(time.RFC3339Nano), g.mode)
	cmd := exec.Command(g.bin, "--data-dir", g.dataDir, "--dynamodb-endpoint", g.endpoint,
		"--table-prefix", g.prefix, "--mqtt-addr", g.mqttAddr, "--http-addr", g.httpAddr, "--log-level", "info")
	cmd.Env = g.environ(g.mode)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if g.proc, err = proc.Start("gatewayd", cmd); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		if g.proc.Exited() {
			return fmt.Errorf("gatewayd exited during startup (%s):\n%s", g.proc.ExitDescription(), tail(g.logPath, 4096))
		}
		if resp, err := client.Get("http://" + g.httpAddr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			_ = g.proc.Kill()
			return fmt.Errorf("gatewayd not ready within %s:\n%s", readyTimeout, tail(g.logPath, 4096))
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// running reports whether the current process is alive.
func (g *gatewayd) running() bool { return g.proc != nil && !g.proc.Exited() }

// kill9 kills gatewayd with SIGKILL and waits until it is reaped.
func (g *gatewayd) kill9() error {
	if !g.running() {
		return nil
	}
	return g.proc.Kill()
}

// term sends SIGTERM and waits up to the shutdown deadline plus a grace for
// the exit. It returns the time the stop took and an error if gatewayd
// did not exit with status 0 within the deadline.
func (g *gatewayd) term() (time.Duration, error) {
	begin := time.Now()
	if err := g.proc.Signal(syscall.SIGTERM); err != nil {
		return 0, err
	}
	const grace = 5 * time.Second
	if !g.proc.Wait(shutdownTimeout + grace) {
		_ = g.proc.Kill()
		return time.Since(begin), fmt.Errorf("gatewayd still running %s after SIGTERM (deadline %s); killed", shutdownTimeout+grace, shutdownTimeout)
	}
	took := time.Since(begin)
	if code := g.proc.ExitCode(); code != 0 {
		return took, fmt.Errorf("gatewayd exited with %s after SIGTERM, after %s", g.proc.ExitDescription(), took.Round(time.Millisecond))
	}
	if took > shutdownTimeout+time.Second {
		return took, fmt.Errorf("gatewayd took %s to stop, past its %s deadline", took.Round(time.Millisecond), shutdownTimeout)
	}
	return took, nil
}

// errNoSeries is returned by metrics when /metrics lacks a series.
var errNoSeries = errors.New("no such series")

// metrics reads the given series from /metrics.
func (g *gatewayd) metrics(series ...string) (map[string]float64, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + g.httpAddr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		for _, s := range series {
			if v, ok := strings.CutPrefix(sc.Text(), s+" "); ok {
				f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
				if err != nil {
					return nil, fmt.Errorf("metric %s: %w", s, err)
				}
				out[s] = f
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, s := range series {
		if _, ok := out[s]; !ok {
			return out, fmt.Errorf("%s: %w", s, errNoSeries)
		}
	}
	return out, nil
}
