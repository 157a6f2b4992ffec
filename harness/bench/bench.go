//go:build linux

package bench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/fleetgen"
	"greenhouse-gateway/harness/modroot"
	"greenhouse-gateway/harness/proc"
	"greenhouse-gateway/internal/cloud"
)

// Scenario names, in the order they run.
const (
	ScenarioMQTT      = "mqtt"
	ScenarioFixed     = "fixed"
	ScenarioHTTP      = "http"
	ScenarioDrain     = "drain"
	ScenarioLambda    = "lambda"
	ScenarioBytes     = "uplink-bytes"
	ScenarioFootprint = "footprint"
	ScenarioIdle      = "idle"
	ScenarioSDCard    = "sdcard"
)

// Scenarios lists every scenario in run order.
var Scenarios = []string{ScenarioMQTT, ScenarioFixed, ScenarioSDCard, ScenarioHTTP, ScenarioDrain, ScenarioLambda, ScenarioBytes, ScenarioFootprint, ScenarioIdle}

// Config configures a run. DefaultConfig documents the defaults.
type Config struct {
	// Scenarios to run, a subset of Scenarios.
	Scenarios []string `json:"scenarios"`
	// Duration is the measured window of each load (MQTT, HTTP), after
	// Warmup.
	Duration time.Duration `json:"duration_ns"`
	Warmup   time.Duration `json:"warmup_ns"`
	// Devices are the fleet sizes of the MQTT scenario, one run each; the
	// largest also serves the fixed-rate scenario and the drain's backlog.
	Devices []int `json:"devices"`
	// Inflight is how many batches each MQTT device keeps in flight.
	Inflight int `json:"inflight"`
	// Readings is readings per batch.
	Readings int `json:"readings_per_batch"`
	// FixedRate is the offered load of the fixed-rate scenario, batches/s.
	FixedRate float64 `json:"fixed_rate"`
	// HTTPClients is the number of concurrent keep-alive HTTP clients.
	HTTPClients int `json:"http_clients"`
	// DrainReadings is the size of the drain's backlog, in readings.
	DrainReadings int `json:"drain_readings"`
	// DrainBaselineReadings is how many readings of the backlog (its
	// oldest batches) the SDK loop writes: a rate is compared, and
	// DynamoDB Local is slow. 0 means the whole backlog.
	DrainBaselineReadings int `json:"drain_baseline_readings"`
	// DrainTimeout bounds one drain.
	DrainTimeout time.Duration `json:"drain_timeout_ns"`
	// LinkDelay is what the fault proxy adds to every DynamoDB request of
	// the drain over a slow link (0: no such drain).
	LinkDelay time.Duration `json:"link_delay_ns"`
	// UplinkConcurrency is the SDK loop's concurrency, and gatewayd's
	// uplink.concurrency (where its adaptive limit starts).
	UplinkConcurrency int `json:"uplink_concurrency"`
	// CeilingGoroutines are the goroutine counts the plain same-items
	// BatchWriteItem writer runs at before the drains; the fastest count writes the
	// ceiling just before and just after each drain.
	CeilingGoroutines []int `json:"ceiling_goroutines"`
	// DrainModes are the uplink write modes the drain runs, of
	// "transaction" and "batch"; they run in that order whatever the
	// order given.
	DrainModes []string `json:"drain_modes"`
	// DrainRepeats is how many batch-mode drains run, each on a backlog
	// of its own between its own two plain-writer runs; the median drain
	// by its ratio to its ceiling is reported, and every ratio noted.
	DrainRepeats int `json:"drain_repeats"`
	// LambdaInstances is how many Runtime Interface Emulators run the
	// readings function in the lambda scenario, side by side behind
	// invokeproxy (each runs one invocation at a time), as Lambda runs
	// concurrent instances.
	LambdaInstances int `json:"lambda_instances"`
	// BytesLive is how long the uplink-bytes scenario's live rate runs for
	// each uplink target; BytesDevices its devices, each sending a batch
	// of Readings readings a minute, and the devices of its backlog;
	// BytesBacklog the backlog's readings.
	BytesLive    time.Duration `json:"bytes_live_ns"`
	BytesDevices int           `json:"bytes_devices"`
	BytesBacklog int           `json:"bytes_backlog_readings"`
	// ReadyReadings is the backlog of the time-to-ready figure; ReadyRuns
	// how many starts are measured (the median is reported).
	ReadyReadings int `json:"ready_readings"`
	ReadyRuns     int `json:"ready_runs"`
	// CacheDir keeps the time-to-ready data directory between runs.
	CacheDir string `json:"cache_dir"`
	// Profile records gatewayd with perf during the largest MQTT run.
	Profile bool `json:"profile"`
	// ProfileOut is where the profile's report goes.
	ProfileOut string `json:"profile_out,omitempty"`
	// CPUProfileDir, when set, receives gatewayd's Go CPU profile of each
	// MQTT run's measured window, cpu-mqtt-N.pb.gz, and of each drain's
	// first 10 s, named after its backlog: cpu-drain-MODE.pb.gz,
	// cpu-drain-batch-N.pb.gz for the repeats, cpu-drain-slow-link.pb.gz,
	// cpu-drain-lambda-N.pb.gz (go tool pprof); each with an alloc-*.pb.gz
	// of what gatewayd allocated in the same window.
	CPUProfileDir string `json:"cpu_profile_dir,omitempty"`
	// KeepWork keeps the work directory (logs, data directories).
	KeepWork bool `json:"keep_work"`
	// IdleSettle is how long after its fleet's first batches the idle
	// scenario takes its "idle settled" sample.
	IdleSettle time.Duration `json:"idle_settle_ns"`
	// IdleBaselineBin is a gatewayd binary (say, built from an earlier
	// revision) the idle scenario measures the same way first.
	IdleBaselineBin string `json:"idle_baseline_bin,omitempty"`
	// GatewayEnv are extra KEY=VALUE settings for every gatewayd (for
	// experiments, e.g. GATEWAY_DEVICES_FLUSH_INTERVAL=1h).
	GatewayEnv []string `json:"gateway_env,omitempty"`
}

// DefaultConfig returns the defaults of cmd/bench.
func DefaultConfig() Config {
	return Config{
		Scenarios:             slices.Clone(Scenarios),
		Duration:              20 * time.Second,
		Warmup:                2 * time.Second,
		Devices:               []int{100, 1000},
		Inflight:              4,
		Readings:              10,
		FixedRate:             1000,
		HTTPClients:           64,
		DrainReadings:         100_000,
		DrainBaselineReadings: 20_000,
		DrainTimeout:          10 * time.Minute,
		LinkDelay:             30 * time.Millisecond,
		UplinkConcurrency:     16,
		CeilingGoroutines:     []int{4, 8, 16, 32},
		DrainModes:            []string{"transaction", "batch"},
		DrainRepeats:          3,
		LambdaInstances:       1,
		BytesLive:             3 * time.Minute,
		BytesDevices:          100,
		BytesBacklog:          20_000,
		ReadyReadings:         1_000_000,
		ReadyRuns:             3,
		CacheDir:              ".cache/bench",
		IdleSettle:            75 * time.Second,
	}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	for _, s := range c.Scenarios {
		if !slices.Contains(Scenarios, s) {
			return fmt.Errorf("unknown scenario %q (want some of %s)", s, strings.Join(Scenarios, ","))
		}
	}
	switch {
	case len(c.Scenarios) == 0:
		return errors.New("no scenario")
	case c.Duration <= 0 || c.Duration > 10*time.Minute:
		return errors.New("duration: must be between 0 and 10m")
	case c.Warmup < 0 || c.Warmup > time.Minute:
		return errors.New("warmup: must be between 0 and 1m")
	case len(c.Devices) == 0:
		return errors.New("devices: at least one fleet size")
	case c.Inflight < 1 || c.Inflight > 64:
		return errors.New("inflight: must be between 1 and 64")
	case c.Readings < 1 || c.Readings > contract.DefaultMaxReadings:
		return fmt.Errorf("readings: must be between 1 and %d", contract.DefaultMaxReadings)
	case c.FixedRate <= 0 || c.FixedRate > 100_000:
		return errors.New("fixed rate: must be between 0 and 100000")
	case c.HTTPClients < 1 || c.HTTPClients > 1024:
		return errors.New("http clients: must be between 1 and 1024")
	case c.DrainReadings < c.Readings || c.DrainReadings > 10_000_000:
		return errors.New("drain readings: must be between one batch and 10,000,000")
	case c.LinkDelay < 0 || c.LinkDelay > 10*time.Second:
		return errors.New("link delay: must be between 0 and 10s")
	case c.DrainBaselineReadings < 0:
		return errors.New("drain baseline readings: must not be negative")
	case c.DrainTimeout <= 0:
		return errors.New("drain timeout: must be positive")
	case c.LambdaInstances < 1 || c.LambdaInstances > 16:
		return errors.New("lambda instances: must be between 1 and 16")
	case c.UplinkConcurrency < 1 || c.UplinkConcurrency > 256:
		return errors.New("uplink concurrency: must be between 1 and 256")
	case c.DrainRepeats < 1 || c.DrainRepeats > 9:
		return errors.New("drain repeats: must be between 1 and 9")
	case len(c.DrainModes) == 0 || slices.ContainsFunc(c.DrainModes, func(m string) bool { return !slices.Contains(writeModes, m) }):
		return fmt.Errorf("drain modes %q: one or both of %s", c.DrainModes, strings.Join(writeModes, ", "))
	case len(c.CeilingGoroutines) == 0 || slices.ContainsFunc(c.CeilingGoroutines, func(n int) bool { return n < 1 || n > 256 }):
		return errors.New("ceiling goroutines: at least one count, each between 1 and 256")
	case c.BytesLive < 10*time.Second || c.BytesLive > 30*time.Minute:
		return errors.New("bytes live: must be between 10s and 30m")
	case c.BytesDevices < 1 || c.BytesDevices > 10_000:
		return errors.New("bytes devices: must be between 1 and 10000")
	case c.BytesBacklog < c.Readings || c.BytesBacklog > 1_000_000:
		return errors.New("bytes backlog: must be between one batch and 1,000,000 readings")
	case c.ReadyReadings < c.Readings || c.ReadyReadings > 10_000_000:
		return errors.New("ready readings: must be between one batch and 10,000,000")
	case c.ReadyRuns < 1 || c.ReadyRuns > 20:
		return errors.New("ready runs: must be between 1 and 20")
	case c.IdleSettle < 2*time.Second || c.IdleSettle > 10*time.Minute:
		return errors.New("idle settle: must be between 2s and 10m")
	}
	for _, kv := range c.GatewayEnv {
		// The Go runtime's own variables are allowed too, for memory
		// experiments.
		k, _, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(k, "GATEWAY_") && k != "GODEBUG" && k != "GOGC" && k != "GOMEMLIMIT" && k != "GOMAXPROCS" {
			return fmt.Errorf("gateway env %q: want GATEWAY_NAME=VALUE (or GODEBUG, GOGC, GOMEMLIMIT, GOMAXPROCS)", kv)
		}
	}
	for _, n := range c.Devices {
		if n < 1 || n > 10_000 {
			return errors.New("devices: each between 1 and 10000")
		}
	}
	return nil
}

func (c Config) has(s string) bool { return slices.Contains(c.Scenarios, s) }

func (c Config) maxDevices() int { return slices.Max(c.Devices) }

// runner holds what the scenarios share.
type runner struct {
	cfg    Config
	log    *slog.Logger
	res    *Results
	root   string
	work   string
	bin    string
	dynamo *dynamoLocal
	// closed is a DynamoDB endpoint nothing listens on: ingest runs use it.
	closed string
	key    string
	prefix string
	// seed is a data directory whose API key cache holds key.
	seed  string
	fleet byte
	// txLimit is the endpoint's per-transaction action limit, probed
	// before the drains.
	txLimit int
	// canonicalPerReading is the canonical payload size per reading of the
	// benchmark's batches.
	canonicalPerReading float64
	// liveDisk is the data directory of the largest MQTT run, measured
	// while gatewayd runs.
	liveDisk *liveDisk
}

type liveDisk struct {
	Usage    diskUsage `json:"usage"`
	Readings int64     `json:"pending_readings"`
}

// Run runs the configured scenarios and returns their results.
func Run(ctx context.Context, cfg Config, logger *slog.Logger) (*Results, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	root, err := modroot.Find()
	if err != nil {
		return nil, err
	}
	if !filepath.IsAbs(cfg.CacheDir) {
		cfg.CacheDir = filepath.Join(root, cfg.CacheDir)
	}
	work, err := os.MkdirTemp("", "gateway-bench-")
	if err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, log: logger, root: root, work: work, fleet: 1,
		res: &Results{StartedAt: time.Now().UTC(), Config: cfg, Details: map[string]any{}}}
	r.res.Host = Host{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), LoadStart: loadavg(),
		Kernel: strings.TrimSpace(readFile("/proc/sys/kernel/osrelease")), GatewayRev: gitRevision(root)}
	defer func() {
		if r.dynamo != nil {
			r.dynamo.stop()
		}
		if cfg.KeepWork {
			logger.Info("work directory kept", "dir", work)
		} else {
			_ = os.RemoveAll(work)
		}
	}()
	begin := time.Now()
	if err := r.run(ctx); err != nil {
		return r.res, fmt.Errorf("%w (work directory %s)", err, work)
	}
	r.res.Seconds = time.Since(begin).Seconds()
	r.res.Host.LoadEnd = loadavg()
	r.res.note("host: %d CPUs, load average %s at the start and %s at the end; whatever else runs on the machine "+
		"competes with gatewayd, its baselines and the load generator (which runs on the same CPUs)",
		r.res.Host.CPUs, r.res.Host.LoadStart, r.res.Host.LoadEnd)
	return r.res, nil
}

func (r *runner) run(ctx context.Context) error {
	r.log.Info("building gatewayd")
	var err error
	if r.bin, err = buildGatewayd(ctx, r.root, r.work); err != nil {
		return err
	}
	if r.closed, err = closedEndpoint(); err != nil {
		return err
	}
	if r.canonicalPerReading, err = canonicalPerReading(r.cfg.Readings); err != nil {
		return err
	}
	ingest := r.cfg.has(ScenarioMQTT) || r.cfg.has(ScenarioFixed) || r.cfg.has(ScenarioSDCard) || r.cfg.has(ScenarioHTTP) ||
		r.cfg.has(ScenarioIdle)
	if ingest || r.cfg.has(ScenarioDrain) || r.cfg.has(ScenarioLambda) || r.cfg.has(ScenarioBytes) {
		r.log.Info("starting DynamoDB Local")
		if r.dynamo, err = startDynamoLocal(ctx, r.root, r.work); err != nil {
			return err
		}
		r.res.Host.DynamoLocal = r.dynamo.endpoint
	}
	if ingest {
		if err := r.prepareIngest(ctx); err != nil {
			return err
		}
	}
	if r.cfg.has(ScenarioMQTT) {
		for _, n := range r.cfg.Devices {
			if err := r.mqtt(ctx, n); err != nil {
				return fmt.Errorf("mqtt, %d devices: %w", n, err)
			}
		}
	}
	if r.cfg.has(ScenarioFixed) {
		if err := r.fixed(ctx); err != nil {
			return fmt.Errorf("fixed rate: %w", err)
		}
	}
	if r.cfg.has(ScenarioSDCard) {
		if err := r.sdcard(ctx); err != nil {
			return fmt.Errorf("sdcard: %w", err)
		}
	}
	if r.cfg.has(ScenarioHTTP) {
		if err := r.http(ctx); err != nil {
			return fmt.Errorf("http: %w", err)
		}
	}
	if r.cfg.has(ScenarioDrain) {
		if err := r.drain(ctx); err != nil {
			return fmt.Errorf("drain: %w", err)
		}
	}
	if r.cfg.has(ScenarioLambda) {
		if err := r.lambdaDrain(ctx); err != nil {
			return fmt.Errorf("drain through lambda: %w", err)
		}
	}
	if r.cfg.has(ScenarioBytes) {
		if err := r.uplinkBytes(ctx); err != nil {
			return fmt.Errorf("uplink bytes: %w", err)
		}
	}
	if r.cfg.has(ScenarioFootprint) {
		if err := r.footprint(ctx); err != nil {
			return fmt.Errorf("footprint: %w", err)
		}
	}
	if r.cfg.has(ScenarioIdle) {
		if err := r.idle(ctx); err != nil {
			return fmt.Errorf("idle: %w", err)
		}
	}
	return nil
}

// prepareIngest creates the tables and an API key, and a seed data
// directory in which gatewayd verified and cached the key.
func (r *runner) prepareIngest(ctx context.Context) error {
	var tables cloud.Tables
	var err error
	if r.prefix, tables, err = newTables(ctx, r.dynamo.client, true); err != nil {
		return err
	}
	if r.key, _, err = cloud.NewKeys(r.dynamo.client, tables.APIKeys, pepper).Create(ctx, "bench"); err != nil {
		return err
	}
	r.seed = filepath.Join(r.work, "seed")
	g, err := startGatewayd(ctx, gatewaydSpec{bin: r.bin, dataDir: r.seed, endpoint: r.dynamo.endpoint,
		prefix: r.prefix, logPath: filepath.Join(r.work, "gatewayd-seed.log"), env: r.env()})
	if err != nil {
		return err
	}
	// Any device request verifies the key; an empty list of batches is
	// refused after that.
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+g.httpAddr+"/v1/readings",
		strings.NewReader(`{"batches":[]}`))
	req.Header.Set("Authorization", "Bearer "+r.key)
	resp, err := g.http.Do(req)
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusServiceUnavailable {
			err = fmt.Errorf("verifying the key: %s", resp.Status)
		}
	}
	return errors.Join(err, g.stop())
}

// startIngestGateway starts gatewayd on a copy of the seed directory, with
// an unreachable DynamoDB (the key stays trusted from its cache).
func (r *runner) startIngestGateway(ctx context.Context, name string) (*gatewayd, string, error) {
	g, err := r.startIngestGatewayIn(ctx, r.work, name)
	return g, filepath.Join(r.work, name), err
}

// startIngestGatewayIn is startIngestGateway with the data directory in
// base.
func (r *runner) startIngestGatewayIn(ctx context.Context, base, name string) (*gatewayd, error) {
	dir := filepath.Join(base, name)
	if err := copyDir(r.seed, dir); err != nil {
		return nil, err
	}
	// The HTTP load's clients and the bench's /metrics reader all come
	// from 127.0.0.1, so the cap on one source's connections (64 by
	// default, a LAN host's share) is raised above them: at the cap
	// gatewayd closes the longest-idle connection, the reader's, for a
	// newcomer, as it is meant to.
	perAddr := r.cfg.HTTPClients + 8
	return startGatewayd(ctx, gatewaydSpec{bin: r.bin, dataDir: dir, endpoint: r.closed, prefix: r.prefix,
		logPath: filepath.Join(r.work, "gatewayd-"+name+".log"),
		env: r.env("GATEWAY_AUTH_REFRESH_INTERVAL=24h", fmt.Sprintf("GATEWAY_HTTP_MAX_CONNS_PER_ADDR=%d", perAddr),
			fmt.Sprintf("GATEWAY_HTTP_MAX_CONNS=%d", max(1024, perAddr)))})
}

// env is extra plus the configured GatewayEnv, which wins.
func (r *runner) env(extra ...string) []string {
	return append(slices.Clone(extra), r.cfg.GatewayEnv...)
}

func (r *runner) nextFleet() byte {
	r.fleet++
	return r.fleet
}

// closedEndpoint returns an http:// endpoint on a port nothing listens on.
func closedEndpoint() (string, error) {
	addr, err := proc.FreeAddr()
	if err != nil {
		return "", err
	}
	return "http://" + addr, nil
}

// canonicalPerReading is the canonical payload size per reading of the
// benchmark's batches, over 200 of them.
func canonicalPerReading(readings int) (float64, error) {
	d := fleetgen.NewDevice(fleetgen.HardwareID(0, 0), time.Now().Add(-time.Hour), 1)
	var total int
	for range 200 {
		_, payload, err := d.Next(readings)
		if err != nil {
			return 0, err
		}
		b, err := contract.DecodeBatch(payload, d.HardwareID(), contract.DefaultLimits(), time.Now())
		if err != nil {
			return 0, err
		}
		total += len(b.Canonical())
	}
	return float64(total) / float64(200*readings), nil
}

// cpuMark snapshots a process's CPU time.
type cpuMark struct {
	pid        int
	start, end time.Duration
	err        error
}

func (c *cpuMark) hooks(extra ...loadHooks) loadHooks {
	return loadHooks{
		start: func() {
			var err error
			c.start, err = procCPU(c.pid)
			c.err = errors.Join(c.err, err)
			for _, h := range extra {
				if h.start != nil {
					h.start()
				}
			}
		},
		end: func() {
			var err error
			c.end, err = procCPU(c.pid)
			c.err = errors.Join(c.err, err)
			for _, h := range extra {
				if h.end != nil {
					h.end()
				}
			}
		},
	}
}

func (c *cpuMark) seconds() float64 { return (c.end - c.start).Seconds() }

// perReading10k is seconds per 10,000 readings.
func perReading10k(seconds, readings float64) float64 {
	if readings == 0 {
		return 0
	}
	return seconds / readings * 10_000
}

// metricsMark snapshots gatewayd's metrics.
type metricsMark struct {
	g          *gatewayd
	ctx        context.Context
	start, end samples
	err        error
}

func (m *metricsMark) hooks() loadHooks {
	return loadHooks{
		start: func() {
			var err error
			m.start, err = m.g.metrics(m.ctx)
			m.err = errors.Join(m.err, err)
		},
		end: func() {
			var err error
			m.end, err = m.g.metrics(m.ctx)
			m.err = errors.Join(m.err, err)
		},
	}
}

// commitStats are the buffer's group commits over a window, from gatewayd's
// metrics.
type commitStats struct {
	Commits         float64 `json:"commits"`
	CommitsPerSec   float64 `json:"commits_per_s"`
	AvgGroupBatches float64 `json:"avg_group_batches"`
	AvgCommitMS     float64 `json:"avg_commit_ms"`
	// CommitP99MS and IngestP99MS are the upper bounds of the histogram
	// buckets holding the 99th percentile of group commits
	// (gateway_buffer_commit_duration_seconds) and of the time from a
	// message or request handed to the ingest path to its answer
	// (gateway_ingest_duration_seconds of the transport): what of the
	// latency the load generator sees is spent inside gatewayd.
	CommitP99MS float64 `json:"commit_p99_ms_at_most"`
	IngestP99MS float64 `json:"ingest_p99_ms_at_most"`
	// CommitMaxMS bounds the slowest group commit: one commit that waits
	// on the disk holds every batch of its group and of the group queued
	// behind it, so a handful of them set a latency percentile of batches
	// that the commits' own 99th percentile does not show.
	CommitMaxMS float64 `json:"commit_max_ms_at_most"`
	Goroutines  float64 `json:"goroutines_end"`
}

// inside describes the time spent inside gatewayd, for a note.
func (s commitStats) inside() string {
	return fmt.Sprintf("; inside gatewayd the 99th percentile of a message's or request's ingest was at most %g ms "+
		"(gateway_ingest_duration_seconds), of a group commit at most %g ms, the slowest group commit at most %g ms",
		s.IngestP99MS, s.CommitP99MS, s.CommitMaxMS)
}

func (m *metricsMark) commits(window float64, transport string) commitStats {
	if m.start == nil || m.end == nil {
		return commitStats{}
	}
	n := delta(m.start, m.end, "gateway_buffer_commit_group_batches_count")
	s := commitStats{Commits: n, CommitsPerSec: n / window, Goroutines: m.end.sum("go_goroutines"),
		CommitP99MS: quantileBound(m.start, m.end, "gateway_buffer_commit_duration_seconds", 0.99) * 1000,
		CommitMaxMS: quantileBound(m.start, m.end, "gateway_buffer_commit_duration_seconds", 1) * 1000,
		IngestP99MS: quantileBound(m.start, m.end, "gateway_ingest_duration_seconds", 0.99,
			fmt.Sprintf("transport=%q", transport)) * 1000}
	if n > 0 {
		s.AvgGroupBatches = delta(m.start, m.end, "gateway_buffer_commit_group_batches_sum") / n
		s.AvgCommitMS = delta(m.start, m.end, "gateway_buffer_commit_duration_seconds_sum") / n * 1000
	}
	return s
}

func readFile(path string) string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return string(raw)
}

func gitRevision(root string) string {
	cmd := exec.Command("git", "describe", "--always", "--dirty")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// bufferStamp identifies the buffer package's source, so that a cached data
// directory is rebuilt when the on-disk format may have changed.
func bufferStamp(root string, params string) (string, error) {
	files, err := filepath.Glob(filepath.Join(root, "buffer", "*.go"))
	if err != nil {
		return "", err
	}
	sort.Strings(files)
	h := sha256.New()
	h.Write([]byte(params))
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		raw, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		h.Write([]byte(filepath.Base(f)))
		h.Write(raw)
	}
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}
