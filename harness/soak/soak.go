package soak

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/harness/faultfs"
	"greenhouse-gateway/harness/faultproxy"
	"greenhouse-gateway/internal/cloud"
)

// Scenario names, in the order they run.
const (
	ScenarioKill9    = "kill9"
	ScenarioDynamoDB = "dynamodb"
	ScenarioProxy    = "proxy"
	ScenarioSIGTERM  = "sigterm"
	ScenarioPowerCut = "powercut"
)

// ScenarioSteady runs no fault: SteadyDevices devices for SteadyDuration,
// while gatewayd's resident memory, goroutines and open files are sampled,
// to tell warm-up from a slow leak (memory.go). Its gatewayd keeps the
// readings of delivered batches for steadyHistory, not the default 24 h,
// so that what it stores stops growing within the warm-up: a store still
// filling up adds tables, open files and their indexes to every window.
const ScenarioSteady = "steady"

// steadyHistory is the steady scenario's buffer.history_retention: an
// eighth of its load, at least a minute.
func steadyHistory(load time.Duration) time.Duration {
	return max(time.Minute, (load / 8).Round(time.Second))
}

// readCloudTimeout bounds the read of the tables after a scenario of
// batches acknowledged batches: DynamoDB Local scans about 70,000 items a
// minute here, about 8 readings a batch.
func readCloudTimeout(batches int) time.Duration {
	return 5*time.Minute + time.Duration(batches)*8*time.Minute/50_000
}

// Scenarios returns every scenario name, in running order.
func Scenarios() []string { return append(FaultScenarios(), ScenarioSteady) }

// FaultScenarios returns the scenarios that inject faults, in running
// order; they share Config.Duration.
func FaultScenarios() []string {
	return []string{ScenarioKill9, ScenarioDynamoDB, ScenarioProxy, ScenarioSIGTERM, ScenarioPowerCut}
}

// Config configures a soak. The zero value of a field means its default.
type Config struct {
	// Duration is the load time of the whole soak, split evenly across the
	// scenarios; each scenario adds its setup, drain and check on top.
	// Default 10m.
	Duration time.Duration
	// KillCycles is the number of kill -9 cycles of the kill9 scenario,
	// spread over its share of Duration (fewer if restarts are too slow to
	// fit). Default 100.
	KillCycles int
	// PowerCutCycles is the number of power cuts of the powercut scenario
	// (gatewayd's data directory on faultfs: kill -9, drop everything not
	// fsynced, restart), spread like KillCycles. Default 50.
	PowerCutCycles int
	// PowerCutUntorn makes every power cut drop everything not fsynced.
	// By default every other cut is torn: a random half of the pages
	// written since their file's last fsync survive.
	PowerCutUntorn bool
	// Devices is the number of simulated devices per scenario, half over
	// MQTT and half over HTTP. Default 10.
	Devices int
	// Interval is the time between two batches of one device. Default 500ms
	// (10 devices then send about 170 readings a second, about what the
	// gateway forwards to DynamoDB Local on 2 busy cores).
	Interval time.Duration
	// SteadyDuration is the steady scenario's load time, on top of
	// Duration. Default 1h.
	SteadyDuration time.Duration
	// SteadyDevices is the steady scenario's device count, half over MQTT
	// and half over HTTP. Default 100.
	SteadyDevices int
	// SteadyInterval is the time between two batches of one device in the
	// steady scenario. Default 5s (100 devices: 20 batches a second).
	SteadyInterval time.Duration
	// Scenarios are the scenarios to run. Default all (Scenarios()).
	Scenarios []string
	// Seed makes fault timing, fault choice and sensor values repeatable;
	// 0 picks one, which the report shows.
	Seed uint64
	// Keep keeps the work directory (logs, data, device reports); otherwise
	// it is removed at the end.
	Keep bool
	// WorkDir is where the work directory is created. Default os.TempDir().
	WorkDir string
	// BinDir holds prebuilt gatewayd and devicesim binaries (make build's
	// bin/); empty builds ./cmd/gatewayd and ./cmd/devicesim of the module
	// the working directory is in.
	BinDir string
	// Race builds gatewayd with the race detector (when BinDir is empty).
	// devicesim is never built with it: its MQTT client has a known data
	// race on reconnect (eclipse-paho/paho.mqtt.golang issue 703).
	Race bool
	// WriteMode is gatewayd's uplink.write_mode: "transaction", "batch", or
	// "alternate" (default), which switches between the two at every start
	// of gatewayd (the first start of each scenario alternating too), so
	// that a buffer filled under one mode drains under the other.
	WriteMode string
	// DrainTimeout bounds, after the faults end, the devices' wait for
	// their last answers, and the gateway's wait for an empty buffer while
	// it makes no progress (three times it in all). Default 10m.
	DrainTimeout time.Duration
	// Logger receives progress; nil discards it.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Duration <= 0 {
		c.Duration = 10 * time.Minute
	}
	if c.KillCycles <= 0 {
		c.KillCycles = 100
	}
	if c.PowerCutCycles <= 0 {
		c.PowerCutCycles = 50
	}
	if c.Devices <= 0 {
		c.Devices = 10
	}
	if c.Interval <= 0 {
		c.Interval = 500 * time.Millisecond
	}
	if len(c.Scenarios) == 0 {
		c.Scenarios = Scenarios()
	}
	if c.SteadyDuration <= 0 {
		c.SteadyDuration = time.Hour
	}
	if c.SteadyDevices <= 0 {
		c.SteadyDevices = 100
	}
	if c.SteadyInterval <= 0 {
		c.SteadyInterval = 5 * time.Second
	}
	if c.Seed == 0 {
		c.Seed = rand.Uint64()>>1 | 1
	}
	if c.WorkDir == "" {
		c.WorkDir = os.TempDir()
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 10 * time.Minute
	}
	if c.WriteMode == "" {
		c.WriteMode = "alternate"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	for _, s := range c.Scenarios {
		if !slices.Contains(Scenarios(), s) {
			return fmt.Errorf("soak: unknown scenario %q (known: %s)", s, strings.Join(Scenarios(), ", "))
		}
	}
	switch c.WriteMode {
	case "alternate", "transaction", "batch":
	default:
		return fmt.Errorf("soak: write mode %q is not one of alternate, transaction, batch", c.WriteMode)
	}
	if c.Devices > 1000 || c.SteadyDevices > 1000 {
		return errors.New("soak: at most 1000 devices")
	}
	if c.KillCycles > 100_000 || c.PowerCutCycles > 100_000 {
		return errors.New("soak: at most 100000 kill or power-cut cycles")
	}
	return nil
}

// Figures are the results of one scenario (or of all of them).
type Figures struct {
	Scenario string
	// Cycles counts the fault cycles injected.
	Cycles int
	// Acknowledged counts batches their devices were told "accepted" or
	// "duplicate".
	Acknowledged int
	// Delivered counts acknowledged batches in DynamoDB exactly once: their
	// marker, and exactly the readings their device sent.
	Delivered int
	// Lost counts acknowledged batches missing from DynamoDB (no marker,
	// missing or other readings). Must be 0.
	Lost int
	// Duplicated counts acknowledged batches stored more than once: more
	// readings than sent, a reading also stored under another batch_id, or
	// acknowledged twice. Must be 0.
	Duplicated int
	// Stray counts batches in DynamoDB no device was told were stored.
	// Must be 0 (every device drains its buffer before the check).
	Stray int
	// Rejected counts batches answered "rejected" for good. Must be 0.
	Rejected int
	// Readings counts the device_readings items of acknowledged batches.
	Readings int
	// Redelivered counts batches the uplink sent again and DynamoDB's
	// conditional marker absorbed ("already_delivered"), as far as the
	// gateway's metrics showed them before each kill and stop.
	Redelivered int
	// AnswersLost counts requests whose write happened but whose answer the
	// fault proxy kept from the gateway (lost_response, truncate).
	AnswersLost int
	// MaxStop is the longest SIGTERM stop of gatewayd.
	MaxStop time.Duration
	// Elapsed is the scenario's wall time, setup and check included.
	Elapsed time.Duration
	// Problems lists what went wrong, the first few of each kind in full.
	Problems []string
	// Skipped says why the scenario could not run here (powercut without
	// FUSE); a skipped scenario has no figures.
	Skipped string
	// Dir is the scenario's work directory (removed unless Config.Keep).
	Dir string
	// Memory is the steady scenario's account of gatewayd's resident
	// memory, goroutines and open files after warm-up (memory.go).
	Memory string
}

// OK reports whether the invariant held and nothing else went wrong.
func (f Figures) OK() bool {
	return f.Lost == 0 && f.Duplicated == 0 && f.Stray == 0 && f.Rejected == 0 && len(f.Problems) == 0
}

// Report is the result of a soak.
type Report struct {
	Seed      uint64
	Dir       string
	Scenarios []Figures
}

// Total adds up the scenarios.
func (r Report) Total() Figures {
	t := Figures{Scenario: "total"}
	for _, f := range r.Scenarios {
		t.Cycles += f.Cycles
		t.Acknowledged += f.Acknowledged
		t.Delivered += f.Delivered
		t.Lost += f.Lost
		t.Duplicated += f.Duplicated
		t.Stray += f.Stray
		t.Rejected += f.Rejected
		t.Readings += f.Readings
		t.Redelivered += f.Redelivered
		t.AnswersLost += f.AnswersLost
		t.MaxStop = max(t.MaxStop, f.MaxStop)
		t.Elapsed += f.Elapsed
		t.Problems = append(t.Problems, f.Problems...)
	}
	return t
}

// OK reports whether every scenario is OK.
func (r Report) OK() bool {
	if len(r.Scenarios) == 0 {
		return false
	}
	for _, f := range r.Scenarios {
		if !f.OK() {
			return false
		}
	}
	return true
}

// WriteTable prints the figures per scenario and overall, then the
// problems.
func (r Report) WriteTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tcycles\tacknowledged\tdelivered\tlost\tduplicated\tstray\trejected\treadings\tredelivered\tanswers lost\tmax stop\ttime\tresult\t")
	row := func(f Figures) {
		result := "ok"
		if f.Skipped != "" {
			result = "skipped"
		}
		if !f.OK() {
			result = "FAIL"
		}
		stop := "-"
		if f.MaxStop > 0 {
			stop = f.MaxStop.Round(10 * time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t\n", f.Scenario, f.Cycles, f.Acknowledged,
			f.Delivered, f.Lost, f.Duplicated, f.Stray, f.Rejected, f.Readings, f.Redelivered, f.AnswersLost, stop,
			f.Elapsed.Round(time.Second), result)
	}
	for _, f := range r.Scenarios {
		row(f)
	}
	total := r.Total()
	if !r.OK() && len(r.Scenarios) > 0 {
		total.Problems = append(total.Problems, "") // FAIL in the total row too
	}
	row(total)
	_ = tw.Flush()
	fmt.Fprintf(w, "seed %d; work directory %s\n", r.Seed, r.Dir)
	for _, f := range r.Scenarios {
		if f.Skipped != "" {
			fmt.Fprintf(w, "\n%s skipped: %s\n", f.Scenario, f.Skipped)
		}
		if f.Memory != "" {
			fmt.Fprintf(w, "\n%s memory: %s\n", f.Scenario, f.Memory)
		}
		if len(f.Problems) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s problems (logs in %s):\n", f.Scenario, f.Dir)
		for _, p := range f.Problems {
			fmt.Fprintf(w, "  %s\n", p)
		}
	}
}

// Run runs the configured scenarios one after the other and returns their
// figures. An error means the soak could not run (no DynamoDB Local, no
// gatewayd build, ctx cancelled); a violated invariant is reported in the
// figures (Report.OK).
func Run(ctx context.Context, cfg Config) (Report, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	dir, err := os.MkdirTemp(cfg.WorkDir, "soak-")
	if err != nil {
		return Report{}, fmt.Errorf("creating the work directory: %w", err)
	}
	rep := Report{Seed: cfg.Seed, Dir: dir}
	defer func() {
		if !cfg.Keep {
			_ = os.RemoveAll(dir)
		}
	}()
	log := cfg.Logger
	binDir := cfg.BinDir
	if binDir == "" {
		log.Info("building gatewayd and devicesim", "race", cfg.Race)
		binDir = dir
		if err := buildBinaries(ctx, binDir, cfg.Race); err != nil {
			return rep, err
		}
	}
	if binDir, err = filepath.Abs(binDir); err != nil {
		return rep, err
	}
	bin, devicesimBin := filepath.Join(binDir, "gatewayd"), filepath.Join(binDir, "devicesim")
	for _, b := range []string{bin, devicesimBin} {
		if _, err := os.Stat(b); err != nil {
			return rep, fmt.Errorf("soak: %w", err)
		}
	}
	if _, err := dynamotest.EnsureInstalled(); err != nil {
		return rep, err
	}
	faults := 0
	for _, name := range cfg.Scenarios {
		if name != ScenarioSteady {
			faults++
		}
	}
	share := cfg.Duration / time.Duration(max(faults, 1))
	for i, name := range cfg.Scenarios {
		load := share
		if name == ScenarioSteady {
			load = cfg.SteadyDuration
		}
		sdir := filepath.Join(dir, name)
		if err := os.MkdirAll(sdir, 0o750); err != nil {
			return rep, err
		}
		log.Info("scenario starting", "scenario", name, "load", load.String(), "dir", sdir)
		s := &scenario{name: name, index: i, cfg: cfg, dir: sdir, bin: bin, devicesim: devicesimBin, load: load,
			seed: cfg.Seed + uint64(i)*1000, log: log.With("scenario", name),
			rng: rand.New(rand.NewPCG(cfg.Seed, uint64(i)))}
		begin := time.Now()
		f, err := s.run(ctx)
		f.Dir, f.Elapsed = sdir, time.Since(begin)
		rep.Scenarios = append(rep.Scenarios, f)
		if err != nil {
			return rep, fmt.Errorf("scenario %s: %w", name, err)
		}
		log.Info("scenario done", "scenario", name, "ok", f.OK(), "cycles", f.Cycles, "acknowledged", f.Acknowledged,
			"delivered", f.Delivered, "lost", f.Lost, "duplicated", f.Duplicated, "stray", f.Stray)
	}
	return rep, nil
}

// scenario is one scenario's run: its own DynamoDB Local, tables, API key,
// gatewayd (and data directory), fault proxy and devices.
type scenario struct {
	name  string
	index int
	cfg   Config
	dir   string
	bin   string
	// devicesim is the devicesim binary.
	devicesim string
	load      time.Duration
	seed      uint64
	log       *slog.Logger
	rng       *rand.Rand

	dynamo *dynamoLocal
	gw     *gatewayd
	proxy  *faultproxy.Proxy
	disk   *faultfs.FS // the powercut scenario's data directory file system
	fig    Figures
}

func (s *scenario) problem(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.log.Warn("problem", "problem", msg)
	if len(s.fig.Problems) < maxProblems {
		s.fig.Problems = append(s.fig.Problems, msg)
	}
}

// run sets the scenario up, drives devices while injecting its faults, ends
// the faults, waits for everything to drain and checks the invariant.
func (s *scenario) run(ctx context.Context) (Figures, error) {
	s.fig.Scenario = s.name

	dbPath, err := dynamoDBPath(s.dir)
	if err != nil {
		return s.fig, err
	}
	if !s.cfg.Keep || !strings.HasPrefix(dbPath, s.dir) {
		defer os.RemoveAll(dbPath)
	}
	if s.dynamo, err = newDynamoLocal(s.dir, dbPath); err != nil {
		return s.fig, err
	}
	if err := s.dynamo.start(ctx); err != nil {
		return s.fig, err
	}
	defer func() { _ = s.dynamo.kill() }()

	client, err := cloud.NewClient(ctx, cloud.Config{Endpoint: s.dynamo.endpoint, Region: "us-east-1"})
	if err != nil {
		return s.fig, err
	}
	prefix := "soak_" + s.name + "_"
	tables := cloud.TableNames(prefix)
	tctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := cloud.CreateTables(tctx, client, tables, nil); err != nil {
		return s.fig, err
	}
	key, _, err := cloud.NewKeys(client, tables.APIKeys, pepper).Create(tctx, "soak "+s.name)
	if err != nil {
		return s.fig, err
	}
	err = s.drive(ctx, client, tables, prefix, key)
	return s.fig, err
}

func (s *scenario) drive(ctx context.Context, client *dynamodb.Client, tables cloud.Tables, prefix, key string) error {
	endpoint := s.dynamo.endpoint
	if s.name == ScenarioProxy || s.name == ScenarioSIGTERM {
		p, stop, err := faultproxy.Launch(faultproxy.Config{Target: s.dynamo.endpoint, Seed: s.seed})
		if err != nil {
			return err
		}
		defer func() { _ = stop() }()
		s.proxy, endpoint = p, p.URL()
	}
	var err error
	if s.gw, err = newGatewayd(s.bin, s.dir, endpoint, prefix); err != nil {
		return err
	}
	if s.name == ScenarioSteady {
		port, err := pickPort()
		if err != nil {
			return err
		}
		s.gw.pprofAddr = "127.0.0.1:" + strconv.Itoa(port)
		s.gw.extra = []string{"GATEWAY_BUFFER_HISTORY_RETENTION=" + steadyHistory(s.load).String(),
			"GATEWAY_DEBUG_PPROF_ADDR=" + s.gw.pprofAddr}
	}
	if s.name == ScenarioPowerCut {
		if s.disk, err = s.mountDisk(); err != nil {
			return err
		}
		if s.disk == nil {
			return nil // skipped
		}
		defer func() {
			if err := s.disk.Unmount(); err != nil {
				s.problem("%v", err)
			}
		}()
		s.gw.dataDir = filepath.Join(s.disk.Dir(), "gateway-data")
	}
	if s.cfg.WriteMode == "alternate" {
		s.gw.writeModes, s.gw.offset = []string{"transaction", "batch"}, s.index
	} else {
		s.gw.writeModes = []string{s.cfg.WriteMode}
	}
	if err := s.gw.start(ctx); err != nil {
		return err
	}
	defer func() { _ = s.gw.kill9() }()

	devices, interval := s.cfg.Devices, s.cfg.Interval
	if s.name == ScenarioSteady {
		devices, interval = s.cfg.SteadyDevices, s.cfg.SteadyInterval
	}
	fl, err := startFleet(fleetConfig{
		bin: s.devicesim, devices: devices, interval: interval, load: s.load, drain: s.cfg.DrainTimeout,
		seed: s.seed, apiKey: key, dir: s.dir,
		mqttURL: "tcp://" + s.gw.mqttAddr, httpURL: "http://" + s.gw.httpAddr,
	})
	if err != nil {
		return err
	}
	defer fl.stop()
	until := time.Now().Add(s.load)

	switch s.name {
	case ScenarioKill9:
		s.kill9(ctx, until)
	case ScenarioDynamoDB:
		s.dynamoFaults(ctx, until)
	case ScenarioProxy:
		s.proxyFaults(ctx, until)
	case ScenarioSIGTERM:
		s.sigterm(ctx, until)
	case ScenarioPowerCut:
		s.powerCuts(ctx, until)
	case ScenarioSteady:
		s.steady(ctx, until)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}

	// The faults end: everything up and passing.
	s.log.Info("faults over; draining", "cycles", s.fig.Cycles)
	if s.proxy != nil {
		_ = s.proxy.Set(faultproxy.Fault{})
	}
	if err := s.dynamo.ensureRunning(ctx); err != nil {
		return fmt.Errorf("restarting DynamoDB Local after the faults: %w", err)
	}
	if !s.ensureGateway(ctx) {
		return errors.New("gatewayd does not start")
	}
	// Devices stop producing when their load time is over, then get their
	// buffers confirmed.
	if err := fl.wait(ctx, time.Until(until)+s.cfg.DrainTimeout+time.Minute); err != nil {
		s.problem("devices: %v", err)
		fl.stop()
	}
	lines, stats, err := fl.results()
	if err != nil {
		return err
	}
	if stats.pending > 0 {
		s.problem("devices stopped with %d batches never confirmed by the gateway (drain timeout %s)", stats.pending, s.cfg.DrainTimeout)
	}
	if stats.overflow > 0 {
		s.problem("devices dropped %d batches from full offline buffers", stats.overflow)
	}
	s.log.Info("devices done", "built", stats.built, "sent", stats.sent, "resent", stats.resent,
		"accepted", stats.accepted, "duplicates", stats.duplicates, "reboots", stats.reboots)

	s.waitDrained(ctx)
	s.scrape()
	if s.proxy != nil {
		ps := s.proxy.Stats()
		s.fig.AnswersLost = int(ps.AnswersLost)
		s.log.Info("fault proxy", "requests", ps.Requests, "errors", ps.Errors, "answers_lost", ps.AnswersLost,
			"released", ps.Released, "abandoned", ps.Abandoned, "upstream_errors", ps.UpstreamErrors)
	}
	// A last graceful stop, checked like the others.
	if took, err := s.gw.term(); err != nil {
		s.problem("final SIGTERM: %v", err)
	} else {
		s.fig.MaxStop = max(s.fig.MaxStop, took)
	}

	rctx, cancel := context.WithTimeout(ctx, readCloudTimeout(len(lines)))
	defer cancel()
	st, err := readCloud(rctx, client, tables)
	if err != nil {
		return fmt.Errorf("reading DynamoDB Local: %w", err)
	}
	checkInvariant(&s.fig, lines, st)
	s.log.Info("checked", "markers", len(st.markers), "reading_items", st.items)
	s.checkLog()
	return nil
}

// checkLog looks through gatewayd's log, all its runs, for what must never
// be there: a panic, a fatal error, a data race (with -race builds).
func (s *scenario) checkLog() {
	f, err := os.Open(s.gw.logPath)
	if err != nil {
		s.problem("reading gatewayd's log: %v", err)
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	errorLines := 0
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "panic:"), strings.HasPrefix(line, "fatal error:"),
			strings.Contains(line, "WARNING: DATA RACE"):
			s.problem("gatewayd.log line %d: %s", n, line)
		case strings.Contains(line, "level=ERROR"):
			errorLines++
		}
	}
	if errorLines > 0 {
		s.log.Info("gatewayd logged errors", "lines", errorLines, "log", s.gw.logPath)
	}
}

// ensureGateway restarts gatewayd if it died on its own, which is a problem
// in itself. It reports whether gatewayd runs.
func (s *scenario) ensureGateway(ctx context.Context) bool {
	if s.gw.running() {
		return true
	}
	if s.gw.proc != nil {
		s.problem("gatewayd exited on its own (%s); log tail:\n%s", s.gw.proc.ExitDescription(), tail(s.gw.logPath, 2048))
	}
	return s.restartGateway(ctx)
}

// restartGateway starts gatewayd, retrying twice; a gatewayd that does not
// start is a problem.
func (s *scenario) restartGateway(ctx context.Context) bool {
	var err error
	for attempt := 0; attempt < 3 && ctx.Err() == nil; attempt++ {
		if err = s.gw.start(ctx); err == nil {
			return true
		}
		s.log.Warn("gatewayd did not start", "attempt", attempt+1, "err", err)
		sleep(ctx, time.Second)
	}
	s.problem("gatewayd does not start: %v", err)
	return false
}

// scrape adds the "already_delivered" and dead-letter counts of the running
// gatewayd (since its start) to the figures; called before each planned
// stop.
func (s *scenario) scrape() {
	const (
		already = `gateway_uplink_batches_total{result="already_delivered"}`
		dead    = `gateway_buffer_dead_lettered_batches_total`
	)
	m, err := s.gw.metrics(already, dead)
	if err != nil && !errors.Is(err, errNoSeries) {
		return // gatewayd busy dying; the count is informational
	}
	s.fig.Redelivered += int(m[already])
	if m[dead] > 0 {
		s.problem("gatewayd dead-lettered %v batches", m[dead])
	}
}

// waitDrained waits until gatewayd's buffer is empty: for at most
// Config.DrainTimeout without progress (the pending count not going down),
// and three times that in all.
func (s *scenario) waitDrained(ctx context.Context) {
	begin := time.Now()
	last, lastProgress := -1.0, begin
	var status string
	for ctx.Err() == nil {
		if time.Since(lastProgress) > s.cfg.DrainTimeout || time.Since(begin) > 3*s.cfg.DrainTimeout {
			s.problem("gatewayd's buffer not empty %s after the faults ended: %s", time.Since(begin).Round(time.Second), status)
			return
		}
		if !s.ensureGateway(ctx) {
			return
		}
		m, err := s.gw.metrics("gateway_buffer_pending_batches")
		if err == nil {
			pending := m["gateway_buffer_pending_batches"]
			if pending == 0 {
				s.log.Info("buffer drained", "after", time.Since(begin).Round(time.Second).String())
				return
			}
			if last < 0 || pending < last {
				last, lastProgress = pending, time.Now()
			}
		}
		status = fmt.Sprint(m, err)
		sleep(ctx, 250*time.Millisecond)
	}
}

// between returns a random duration in [lo, hi].
func (s *scenario) between(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(s.rng.Int64N(int64(hi-lo)+1))
}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// pickPort returns a loopback TCP port that was free a moment ago, below
// the kernel's ephemeral range, so that no outgoing connection takes it
// while the process that listens there restarts.
func pickPort() (int, error) {
	lo := 32768
	if raw, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(raw)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 12000 {
				lo = n
			}
		}
	}
	for range 200 {
		port := 10000 + rand.IntN(lo-10000)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		_ = l.Close()
		return port, nil
	}
	return 0, errors.New("soak: no free loopback port below the ephemeral range")
}

// tail returns the last n bytes of a file.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(st.Size()-n, io.SeekStart)
	}
	raw, _ := io.ReadAll(f)
	return string(raw)
}
