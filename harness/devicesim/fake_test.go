package devicesim

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
)

// fakeLink is a link whose sends the test reads and answers by hand. One fakeLink stands for
// every link of a device: a reboot drops it and dials it again.
type fakeLink struct {
	mu        sync.Mutex
	events    chan<- event
	connect   bool // dialling delivers evConnected at once
	dials     int
	drops     int
	down      bool // Send and Register fail with errNotConnected
	sends     []sentBatch
	regs      int
	regBoots  []string // boot_id of every registration sent, in order
	closed    bool
	unsent    int // index of the first send the test has not taken yet
	dropTimes []time.Time
	dialKeys  []string // the API key of every dial, in order
	closes    int
}

type sentBatch struct {
	id    string
	batch contract.Batch
}

func (f *fakeLink) Register(payload []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return errNotConnected
	}
	reg, err := contract.DecodeRegistration(payload, "")
	if err != nil {
		panic(err) // the test fails with the stack
	}
	f.regs++
	f.regBoots = append(f.regBoots, reg.BootID)
	return nil
}

func (f *fakeLink) Send(batchID string, payload []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return errNotConnected
	}
	var b contract.Batch
	if err := json.Unmarshal(payload, &b); err != nil {
		panic(err) // the test fails with the stack
	}
	f.sends = append(f.sends, sentBatch{id: batchID, batch: b})
	return nil
}

func (f *fakeLink) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	f.closes++
	return nil
}

func (f *fakeLink) Drop() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drops++
	f.dropTimes = append(f.dropTimes, time.Now())
	return nil
}

// dial is the fake's dialFunc.
func (f *fakeLink) dial(_ context.Context, _, apiKey string, events chan<- event) (link, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = events
	f.dials++
	f.dialKeys = append(f.dialKeys, apiKey)
	f.closed = false
	if f.connect {
		events <- event{kind: evConnected}
	}
	return f, nil
}

// setConnect sets whether the next dials connect at once.
func (f *fakeLink) setConnect(connect bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.connect = connect
}

// counts returns the number of dials, drops and registrations so far.
func (f *fakeLink) counts() (dials, drops, regs int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dials, f.drops, f.regs
}

// keysDialled returns the API key of every dial so far, and the number of clean closes.
func (f *fakeLink) keysDialled() ([]string, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.dialKeys...), f.closes
}

// registeredBoots returns the boot_id of every registration sent so far.
func (f *fakeLink) registeredBoots() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.regBoots...)
}

// allSends returns every send so far, taken or not.
func (f *fakeLink) allSends() []sentBatch {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]sentBatch(nil), f.sends...)
}

func (f *fakeLink) eventChan() chan<- event {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.events
}

// take returns the sends made since the last call.
func (f *fakeLink) take() []sentBatch {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.sends[f.unsent:]
	f.unsent = len(f.sends)
	return out
}

func (f *fakeLink) registrations() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.regs
}

func (f *fakeLink) setDown(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = down
}

// testHarness runs one device over a fakeLink.
type testHarness struct {
	t      testing.TB
	link   *fakeLink
	dev    *device
	report string
	done   chan DeviceStats

	answeredRegs int // registrations the test confirmed (autoAnswer)
}

// rebootSeed seeds the reboot times of harness devices; testRebootDelays draws the same.
const rebootSeed = 77

// testRebootDelays returns the lifetimes of the first n boots of a harness device.
func testRebootDelays(cfg Config, n int) []time.Duration {
	rng := rand.New(rand.NewPCG(rebootSeed, 0))
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = rebootDelay(cfg.RebootEvery, rng)
	}
	return out
}

// testConfig is a small, fast configuration for device tests.
func testConfig() Config {
	cfg := DefaultConfig()
	cfg.HTTPURL = "http://gateway.invalid"
	cfg.APIKey = "test-key"
	cfg.Devices = 1
	cfg.Interval = time.Second
	cfg.Readings = 5
	cfg.AckTimeout = 10 * time.Second
	cfg.RetryMin = time.Second
	cfg.RetryMax = 8 * time.Second
	cfg.DrainTimeout = time.Minute
	cfg.SummaryInterval = 0
	cfg.Seed = 42
	return cfg
}

func testLogger(tb testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// newTestGenerator returns a generator for hardware id 02:00:00:00:00:01 booted at boot.
func newTestGenerator(cfg *Config, boot time.Time) *generator {
	return newGenerator("02:00:00:00:00:01", "7c9e6679-7425-40de-944b-e07fc1f90ae7", "sim-01",
		cfg, boot, rand.New(rand.NewPCG(cfg.Seed, 0)))
}

// startDevice starts a device over a fakeLink; the dial delivers evConnected at once unless
// connected is false. Call it inside a synctest bubble.
func startDevice(t *testing.T, ctx context.Context, cfg Config, connected bool) *testHarness {
	t.Helper()
	return startDeviceLog(t, ctx, cfg, connected, testLogger(t))
}

// startDeviceLog is startDevice with the device logging to logger.
func startDeviceLog(t *testing.T, ctx context.Context, cfg Config, connected bool, logger *slog.Logger) *testHarness {
	t.Helper()
	require.NoError(t, cfg.Validate())
	h := &testHarness{t: t, link: &fakeLink{connect: connected}, done: make(chan DeviceStats, 1)}
	h.report = filepath.Join(t.TempDir(), "report.jsonl")
	report, err := createReport(h.report)
	require.NoError(t, err)
	t.Cleanup(func() { _ = report.close() })

	c := cfg
	keys, err := openKeyStore(c.KeyStorePath)
	require.NoError(t, err)
	d, err := newDevice(&c, logger, newTestGenerator(&c, time.Now()), h.link.dial, report, keys,
		rand.New(rand.NewPCG(1, 2)), rand.New(rand.NewPCG(rebootSeed, 0)), time.Now)
	require.NoError(t, err)
	h.dev = d
	go func() {
		st, err := d.run(ctx)
		if err != nil {
			t.Errorf("device run: %v", err)
		}
		if err := report.close(); err != nil {
			t.Errorf("closing report: %v", err)
		}
		h.done <- st
	}()
	return h
}

// send delivers an event to the device.
func (h *testHarness) send(ev event) { h.link.eventChan() <- ev }

func (h *testHarness) ack(batchID string, status contract.Status, reason *contract.Reason) {
	h.send(event{kind: evAck, ack: contract.Ack{Type: contract.AckTypeReadings, BatchID: batchID, Status: status, Reason: reason}})
}

func (h *testHarness) registered() {
	h.send(event{kind: evAck, ack: contract.Ack{Type: contract.AckTypeRegister, Status: contract.StatusRegistered,
		ConfirmationID: "550e8400-e29b-41d4-a716-446655440000"}})
}

// wait waits for the device to stop and returns its counters and report.
func (h *testHarness) wait() (DeviceStats, []ReportLine) {
	h.t.Helper()
	st := <-h.done
	return st, readReportFile(h.t, h.report)
}

// readReportFile reads the report file at path.
func readReportFile(t testing.TB, path string) []ReportLine {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	lines, err := ReadReport(f)
	require.NoError(t, err)
	return lines
}

func reasonPtr(r contract.Reason) *contract.Reason { return &r }

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

// fastConfig returns DefaultConfig with the timings of the tests against a real broker or
// HTTP server: a batch every interval, retries from 10 ms up to retryMax, a 5 s ack
// timeout and a drain of at most drain.
func fastConfig(interval, retryMax, drain time.Duration) Config {
	cfg := DefaultConfig()
	cfg.Interval = interval
	cfg.RetryMin = 10 * time.Millisecond
	cfg.RetryMax = retryMax
	cfg.AckTimeout = 5 * time.Second
	cfg.DrainTimeout = drain
	return cfg
}
