package uplink_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/function/event"
	"greenhouse-gateway/harness/faultproxy"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/uplink"
)

// fakeFunction speaks Lambda's Invoke API (POST
// /2015-03-31/functions/{name}/invocations) and answers the native batch
// event like the readings function: one result per id, duplicate for a
// batch it delivered before, a device's batches in event order with the
// later ones not attempted (error) after one that is not settled. Its
// behaviour per invocation and per batch is scripted; it checks the
// protocol, not the tables.
type fakeFunction struct {
	t *testing.T
	// invocation, when set, may answer a whole invocation itself (n counts
	// from 1); it returns false to answer normally.
	invocation func(n int, w http.ResponseWriter) bool
	// event, when set, may answer a decoded event itself, given its
	// batch_ids; it returns false to answer normally.
	event func(batchIDs []string, w http.ResponseWriter) bool
	// status, when set, gives a batch's result status at its k-th sending
	// (from 1); "" means the normal answer, "missing" leaves its id out.
	status func(batchID string, k int) string
	// seen, when set, sees each decoded event before it is answered.
	seen func(ev event.BatchEvent)

	mu          sync.Mutex
	invocations int
	sizes       []int    // batches per answered invocation
	bodies      []int    // event bytes per invocation
	encodings   []string // each invocation's encoding
	plain       []int    // its event's bytes as plain JSON
	sent        map[string]int
	delivered   []string // batch_ids in the order they were first delivered
	isDelivered map[string]bool
	devices     []cloud.DeviceUpsert
	keys        []cloud.KeyWrite
	inflight    map[string]int // devices in invocations being answered
	overlap     bool           // a device was in two invocations at once
	reports     []answeredReport
}

// answeredReport is the report of an answered invocation, with how many
// batches it carried.
type answeredReport struct {
	report *event.UplinkReport
	items  int
}

func newFakeFunction(t *testing.T) (*fakeFunction, string) {
	f := &fakeFunction{t: t, sent: map[string]int{}, isDelivered: map[string]bool{}, inflight: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(srv.Close)
	return f, srv.URL
}

func (f *fakeFunction) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/2015-03-31/functions/readings/invocations" {
		http.Error(w, `{"Type":"User","message":"Function not found"}`, http.StatusNotFound)
		return
	}
	body, err := io.ReadAll(r.Body)
	require.NoError(f.t, err)
	f.mu.Lock()
	f.invocations++
	n := f.invocations
	f.bodies = append(f.bodies, len(body))
	f.mu.Unlock()
	if f.invocation != nil && f.invocation(n, w) {
		return
	}
	ev, encoding, err := event.Unmarshal(body)
	require.NoError(f.t, err)
	f.mu.Lock()
	f.encodings = append(f.encodings, encoding)
	if plain, err := json.Marshal(ev); err == nil {
		f.plain = append(f.plain, len(plain))
	}
	f.mu.Unlock()
	require.Equal(f.t, 1, ev.V)
	require.Equal(f.t, "gateway_batches", ev.Kind)
	require.Equal(f.t, "gw-test", ev.GatewayID)
	if f.event != nil && f.event(eventBatchIDs(f.t, ev), w) {
		return
	}
	if f.seen != nil {
		f.seen(ev)
	}
	f.mu.Lock()
	f.reports = append(f.reports, answeredReport{report: ev.Report, items: len(ev.Items)})
	f.mu.Unlock()
	devices := f.enter(ev)
	defer f.leave(devices)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"v": 1, "results": f.answer(ev)})
}

// enter records the event's devices as in flight, noting a device that
// already is, and leaves time for another invocation to overlap.
func (f *fakeFunction) enter(ev event.BatchEvent) []string {
	f.mu.Lock()
	var devices []string
	for _, it := range ev.Items {
		var b contract.Batch
		require.NoError(f.t, json.Unmarshal(it.Batch, &b))
		if !slices.Contains(devices, b.HardwareID) {
			devices = append(devices, b.HardwareID)
			if f.inflight[b.HardwareID]++; f.inflight[b.HardwareID] > 1 {
				f.overlap = true
			}
		}
	}
	f.mu.Unlock()
	time.Sleep(2 * time.Millisecond)
	return devices
}

func (f *fakeFunction) leave(devices []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, hw := range devices {
		f.inflight[hw]--
	}
}

// answer applies an event and returns its results.
func (f *fakeFunction) answer(ev event.BatchEvent) []map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	var results []map[string]any
	failed := map[string]bool{} // devices whose later batches are not attempted
	for _, it := range ev.Items {
		var b contract.Batch
		require.NoError(f.t, json.Unmarshal(it.Batch, &b))
		f.sent[b.BatchID]++
		st, reason := "", "r"
		if f.status != nil {
			st = f.status(b.BatchID, f.sent[b.BatchID])
		}
		switch {
		case failed[b.HardwareID]:
			st, reason = "error", "not_attempted"
		case st == "missing":
			failed[b.HardwareID] = true
			continue
		case st == "throttled" || st == "error":
			failed[b.HardwareID] = true
		case st == "" && f.isDelivered[b.BatchID]:
			st = "duplicate"
		case st == "":
			st = "delivered"
			f.isDelivered[b.BatchID] = true
			f.delivered = append(f.delivered, b.BatchID)
		}
		results = append(results, map[string]any{"id": it.ID, "status": st, "reason": reason, "message": "m"})
	}
	f.sizes = append(f.sizes, len(ev.Items))
	for _, d := range ev.Devices {
		f.devices = append(f.devices, d.Upsert)
		results = append(results, map[string]any{"id": d.ID, "status": "delivered"})
	}
	for _, k := range ev.Keys {
		f.keys = append(f.keys, k.Write)
		results = append(results, map[string]any{"id": k.ID, "status": "delivered"})
	}
	return results
}

// eventBatchIDs returns an event's batch_ids in event order.
func eventBatchIDs(t *testing.T, ev event.BatchEvent) []string {
	var ids []string
	for _, it := range ev.Items {
		var b contract.Batch
		require.NoError(t, json.Unmarshal(it.Batch, &b))
		ids = append(ids, b.BatchID)
	}
	return ids
}

func (f *fakeFunction) snapshot() (delivered []string, sizes []int, overlap bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.delivered...), append([]int(nil), f.sizes...), f.overlap
}

// newLambdaUplink returns an uplink with the lambda target pointed at url,
// with deps' device records and keys (its Store, Lambda, GatewayID and
// Registerer are set here).
func newLambdaUplink(t *testing.T, buf uplink.Store, url string, cfg uplink.Config, deps uplink.Deps) (*uplink.Uplink, *prometheus.Registry) {
	t.Helper()
	cfg.Target, cfg.Lambda.Function = uplink.TargetLambda, "readings"
	cfg.MinBackoff, cfg.MaxBackoff = 5*time.Millisecond, 50*time.Millisecond
	reg := prometheus.NewRegistry()
	client, err := cloud.NewLambdaClient(context.Background(), cloud.Config{Endpoint: url})
	require.NoError(t, err)
	deps.Store, deps.Lambda, deps.GatewayID, deps.Registerer = buf, client, "gw-test", reg
	up, err := uplink.New(cfg, deps)
	require.NoError(t, err)
	return up, reg
}

// fleetBacklog stores perDevice batches for each of devices devices, in
// rounds (every device's i-th batch, then the (i+1)-th), and returns each
// device's batch_ids in order.
func fleetBacklog(t *testing.T, buf *buffer.Buffer, devices, perDevice int) map[string][]string {
	want := map[string][]string{}
	for i := range perDevice {
		var round []*contract.Batch
		for d := range devices {
			hw := fmt.Sprintf("AA:BB:CC:00:%02X:%02X", d/256, d%256)
			b := seqBatch(t, hw, i, 3)
			round = append(round, b)
			want[hw] = append(want[hw], b.BatchID)
		}
		store(t, buf, round...)
	}
	return want
}

func TestLambdaTargetMicroBatchesAcrossDevicesInOrder(t *testing.T) {
	buf := openBuffer(t)
	want := fleetBacklog(t, buf, 60, 4)
	fn, url := newFakeFunction(t)
	up, reg := newLambdaUplink(t, buf, url, uplink.Config{}, uplink.Deps{})
	runUntilEmpty(t, up, buf)

	delivered, sizes, overlap := fn.snapshot()
	require.Len(t, delivered, 240, "every batch delivered exactly once")
	require.Equal(t, want, perDevice(delivered), "per-device order")
	require.False(t, overlap, "no device is in two invocations at once")
	require.Less(t, len(sizes), 240/10, "batches share invocations: %v", sizes)
	for _, n := range sizes {
		// How full the first invocations are depends on how fast the lease
		// hands batches over (an invocation goes at once when none is in
		// flight); the bound holds whatever the timing.
		require.LessOrEqual(t, n, 200, "no invocation over uplink.lambda.max_items: %v", sizes)
	}
	require.Equal(t, 240.0, metricValue(reg, "gateway_uplink_batches_total", "delivered"))
	require.Equal(t, 720.0, metricValue(reg, "gateway_uplink_readings_total", ""))
	require.Equal(t, float64(len(sizes)), metricValue(reg, "gateway_uplink_lambda_invocations_total", "ok"))
	require.Equal(t, 240.0, metricValue(reg, "gateway_uplink_lambda_results_total", "delivered"))
}

func TestLambdaTargetDemultiplexesResults(t *testing.T) {
	buf := openBuffer(t)
	const conflict, rejected, retried, throttled, missing = "AA:BB:CC:00:00:01", "AA:BB:CC:00:00:02", "AA:BB:CC:00:00:03", "AA:BB:CC:00:00:04", "AA:BB:CC:00:00:05"
	want := map[string][]string{}
	var firsts = map[string]string{}
	for i := range 3 {
		for _, hw := range []string{conflict, rejected, retried, throttled, missing, "AA:BB:CC:00:00:06"} {
			b := seqBatch(t, hw, i, 2)
			store(t, buf, b)
			want[hw] = append(want[hw], b.BatchID)
			if i == 0 {
				firsts[hw] = b.BatchID
			}
		}
	}
	fn, url := newFakeFunction(t)
	fn.status = func(id string, k int) string {
		switch {
		case id == firsts[conflict]:
			return "conflict"
		case id == firsts[rejected]:
			return "rejected"
		case id == firsts[retried] && k <= 2:
			return "error"
		case id == firsts[throttled] && k == 1:
			return "throttled"
		case id == firsts[missing] && k == 1:
			return "missing"
		}
		return ""
	}
	up, reg := newLambdaUplink(t, buf, url, uplink.Config{}, uplink.Deps{})
	runUntilEmpty(t, up, buf)

	delivered, _, _ := fn.snapshot()
	got := perDevice(delivered)
	require.Equal(t, want[conflict][1:], got[conflict], "the refused batch is dead-lettered and the device goes on")
	require.Equal(t, want[rejected][1:], got[rejected])
	for _, hw := range []string{retried, throttled, missing, "AA:BB:CC:00:00:06"} {
		require.Equal(t, want[hw], got[hw], "retried until delivered, later batches after it: %s", hw)
	}
	dead, n, err := buf.DeadLetters(0)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	reasons := map[string]string{}
	for _, d := range dead {
		reasons[d.BatchID] = d.Reason
	}
	require.Contains(t, reasons[firsts[conflict]], "conflict")
	require.Contains(t, reasons[firsts[rejected]], "rejected")
	require.Equal(t, 2.0, metricValue(reg, "gateway_uplink_batches_total", "dead_lettered"))
	require.Equal(t, 2.0, metricValue(reg, "gateway_uplink_lambda_results_total", "error"))
	require.Equal(t, 1.0, metricValue(reg, "gateway_uplink_lambda_results_total", "throttled"))
	require.Equal(t, 1.0, metricValue(reg, "gateway_uplink_lambda_results_total", "missing"))
}

func TestLambdaTargetRetriesFailedInvocationsAndBacksOffOnThrottling(t *testing.T) {
	buf := openBuffer(t)
	want := fleetBacklog(t, buf, 8, 3)
	fn, url := newFakeFunction(t)
	fn.invocation = func(n int, w http.ResponseWriter) bool {
		switch n {
		case 1, 2:
			w.Header().Set("X-Amzn-ErrorType", "TooManyRequestsException")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, `{"Type":"User","message":"Rate Exceeded.","Reason":"ReservedFunctionConcurrentInvocationLimitExceeded"}`)
		case 3:
			w.Header().Set("X-Amz-Function-Error", "Unhandled")
			_, _ = io.WriteString(w, `{"errorMessage":"boom","errorType":"runtime.Error"}`)
		case 4:
			http.Error(w, `{"Type":"Service","message":"internal"}`, http.StatusInternalServerError)
		case 5:
			_, _ = io.WriteString(w, `not json`)
		case 6:
			// The Runtime Interface Emulator's function error: no header.
			_, _ = io.WriteString(w, `{"errorMessage":"boom","errorType":"errorString"}`)
		default:
			return false
		}
		return true
	}
	up, reg := newLambdaUplink(t, buf, url, uplink.Config{Lambda: uplink.LambdaConfig{Concurrency: 8, MaxConcurrency: 8, MaxItems: 4}}, uplink.Deps{})
	runUntilEmpty(t, up, buf)

	delivered, _, _ := fn.snapshot()
	require.Len(t, delivered, 24)
	require.Equal(t, want, perDevice(delivered))
	_, sizes, _ := fn.snapshot()
	for _, n := range sizes {
		require.LessOrEqual(t, n, 4, "uplink.lambda.max_items")
	}
	require.Equal(t, 2.0, metricValue(reg, "gateway_uplink_lambda_invocations_total", "throttled"))
	require.Equal(t, 2.0, metricValue(reg, "gateway_uplink_lambda_invocations_total", "function_error"))
	require.Equal(t, 2.0, metricValue(reg, "gateway_uplink_lambda_invocations_total", "error"))
	require.Less(t, metricValue(reg, "gateway_uplink_lambda_concurrency", ""), 8.0, "throttling halved the invocations in flight")
}

func TestLambdaTargetKeepsEventsUnderMaxBytes(t *testing.T) {
	buf := openBuffer(t)
	// 40 devices' batches of 100 readings do not fit one event.
	for d := range 40 {
		store(t, buf, seqBatch(t, fmt.Sprintf("AA:BB:CC:01:00:%02X", d), 0, 100))
	}
	total := 0
	for _, p := range pendingAll(t, buf) {
		total += len(p.Payload)
	}
	const maxBytes = 64 << 10
	require.Greater(t, total, 2*maxBytes, "the test needs more than two events' worth")
	fn, url := newFakeFunction(t)
	up, _ := newLambdaUplink(t, buf, url, uplink.Config{Lambda: uplink.LambdaConfig{MaxBytes: maxBytes}}, uplink.Deps{})
	runUntilEmpty(t, up, buf)
	delivered, sizes, _ := fn.snapshot()
	require.Len(t, delivered, 40)
	require.Greater(t, len(sizes), 2)
	fn.mu.Lock()
	defer fn.mu.Unlock()
	for i, b := range fn.bodies {
		require.LessOrEqual(t, b, maxBytes)
		require.LessOrEqual(t, fn.plain[i], maxBytes, "the bound holds for the plain event, whatever it compresses to")
	}
}

func TestLambdaEventsTravelCompressed(t *testing.T) {
	for _, enc := range []string{"", "gzip", "none"} {
		t.Run("encoding "+enc, func(t *testing.T) {
			buf := openBuffer(t)
			for d := range 10 {
				store(t, buf, seqBatch(t, fmt.Sprintf("AA:BB:CC:02:00:%02X", d), 0, 20))
			}
			fn, url := newFakeFunction(t)
			up, _ := newLambdaUplink(t, buf, url, uplink.Config{Lambda: uplink.LambdaConfig{Encoding: enc}}, uplink.Deps{})
			runUntilEmpty(t, up, buf)
			delivered, _, _ := fn.snapshot()
			require.Len(t, delivered, 10)
			fn.mu.Lock()
			defer fn.mu.Unlock()
			want := map[string]string{"": "zstd", "gzip": "gzip", "none": "none"}[enc]
			checked := 0
			for i, got := range fn.encodings {
				if fn.plain[i] < 200 { // an empty event does not shrink and goes plain
					continue
				}
				checked++
				require.Equal(t, want, got, "invocation %d", i)
				if want != "none" {
					require.Less(t, fn.bodies[i], fn.plain[i]/3, "invocation %d: %d bytes for %d plain", i, fn.bodies[i], fn.plain[i])
				}
			}
			require.Positive(t, checked, "invocations carried batches")
		})
	}
}

func pendingAll(t *testing.T, buf *buffer.Buffer) []buffer.Pending {
	ps, err := buf.Pending(0, 10000)
	require.NoError(t, err)
	return ps
}

// fakeKeys holds device keys waiting to be written.
type fakeKeys struct {
	mu      sync.Mutex
	pending []cloud.KeyWrite
	written []cloud.KeyWrite
}

func (f *fakeKeys) PendingKeyWrites(int) []cloud.KeyWrite {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]cloud.KeyWrite(nil), f.pending...)
}

func (f *fakeKeys) KeyWritten(w cloud.KeyWrite) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.written = append(f.written, w)
	f.pending = nil
}

func TestLambdaTargetSendsDeviceRecordsAndKeysThroughTheFunction(t *testing.T) {
	buf := openBuffer(t)
	store(t, buf, seqBatch(t, "AA:BB:CC:00:00:01", 0, 1))
	devices := &fakeDevices{}
	devices.add(cloud.DeviceUpsert{HardwareID: "AA:BB:CC:00:00:01", ConfirmationID: "550e8400-e29b-41d4-a716-446655440000",
		FirmwareVersion: "1.0.16", FirstRegisteredAt: time.Unix(1700000000, 0).UTC(), LastSeenAt: time.Unix(1700000300, 0).UTC()})
	keys := &fakeKeys{pending: []cloud.KeyWrite{{Key: cloud.KeyInfo{KeyID: "k1", Hash: strings.Repeat("ab", 32), Active: true, HardwareID: "AA:BB:CC:00:00:01"}}}}
	fn, url := newFakeFunction(t)
	up, reg := newLambdaUplink(t, buf, url, uplink.Config{}, uplink.Deps{Devices: devices, Keys: keys})
	runUntil(t, up, func() bool {
		keys.mu.Lock()
		defer keys.mu.Unlock()
		return buf.Stats().PendingBatches == 0 && devices.written() == 1 && len(keys.written) == 1
	})

	fn.mu.Lock()
	defer fn.mu.Unlock()
	require.Len(t, fn.devices, 1)
	require.Equal(t, "550e8400-e29b-41d4-a716-446655440000", fn.devices[0].ConfirmationID)
	require.True(t, fn.devices[0].FirstRegisteredAt.Equal(time.Unix(1700000000, 0)))
	require.Len(t, fn.keys, 1)
	require.Equal(t, "k1", fn.keys[0].Key.KeyID)
	require.Equal(t, 1.0, metricValue(reg, "gateway_uplink_device_upserts_total", ""))
}

func TestLambdaTargetNeedsAClient(t *testing.T) {
	buf := openBuffer(t)
	_, err := uplink.New(uplink.Config{Target: uplink.TargetLambda, Lambda: uplink.LambdaConfig{Function: "f"}}, uplink.Deps{Store: buf})
	require.ErrorContains(t, err, "needs a Lambda client")
}

// A few devices with deep backlogs still fill invocations: a device's
// consecutive batches go together, and a failure in the middle holds its
// later batches back.
func TestLambdaTargetFillsInvocationsFromFewDevices(t *testing.T) {
	buf := openBuffer(t)
	want := fleetBacklog(t, buf, 3, 40)
	failOnce := want["AA:BB:CC:00:00:01"][10]
	fn, url := newFakeFunction(t)
	fn.status = func(id string, k int) string {
		if id == failOnce && k == 1 {
			return "error"
		}
		return ""
	}
	up, _ := newLambdaUplink(t, buf, url, uplink.Config{Lambda: uplink.LambdaConfig{MaxItems: 60}}, uplink.Deps{})
	runUntilEmpty(t, up, buf)
	delivered, sizes, overlap := fn.snapshot()
	require.Len(t, delivered, 120)
	require.Equal(t, want, perDevice(delivered), "per-device order, through the failure")
	require.False(t, overlap, "no device is in two invocations at once")
	require.Equal(t, 60, slices.Max(sizes), "3 devices fill an invocation of 60")
}

// TestLambdaTargetProbesWhileUnreachable resets every connection to the
// function: after the first failed round, each retry is one invocation
// with an empty event, and the buffer is not read again. Once the function
// answers, the probe reaches it (an invocation of no batches) and every
// batch goes up once, in each device's order.
func TestLambdaTargetProbesWhileUnreachable(t *testing.T) {
	buf := openBuffer(t)
	want := fleetBacklog(t, buf, 3, 4)
	fn, url := newFakeFunction(t)
	proxy := faultproxy.Start(t, url, 0)
	require.NoError(t, proxy.Set(faultproxy.Fault{Mode: faultproxy.Reset}))

	st := &leaseCountingStore{Buffer: buf}
	up, reg := newLambdaUplink(t, st, proxy.URL(), uplink.Config{}, uplink.Deps{})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- up.Run(ctx) }()
	retries := func() float64 { return metricValue(reg, "gateway_uplink_retried_rounds_total", "") }
	require.Eventually(t, func() bool { return retries() >= 2 }, 30*time.Second, 5*time.Millisecond)
	reads := st.reads.Load()
	require.Positive(t, reads, "the first round leased")
	require.Eventually(t, func() bool { return retries() >= 10 }, 30*time.Second, 5*time.Millisecond)
	require.Equal(t, reads, st.reads.Load(), "no round leased while the function could not be reached")
	require.Contains(t, up.Status().LastError, "cloud unreachable")
	require.GreaterOrEqual(t, proxy.Stats().Requests[faultproxy.Reset], uint64(10), "each retry was an invocation")

	require.NoError(t, proxy.Set(faultproxy.Fault{}))
	require.Eventually(t, func() bool { return buf.Stats().PendingBatches == 0 }, 30*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	delivered, sizes, _ := fn.snapshot()
	require.Equal(t, want, perDevice(delivered), "each batch once, in each device's order")
	require.Equal(t, 0, sizes[0], "the first invocation the function saw was the probe's empty event")
}

// A device record the function does not write fails the round: no batch
// goes before its device's record is in the cloud.
func TestLambdaTargetSendsNoBatchBeforeItsDeviceRecord(t *testing.T) {
	buf := openBuffer(t)
	hw := "AA:BB:CC:00:00:02"
	store(t, buf, seqBatch(t, hw, 0, 1))
	devices := &fakeDevices{}
	devices.add(cloud.DeviceUpsert{HardwareID: hw, ConfirmationID: "550e8400-e29b-41d4-a716-446655440000",
		FirmwareVersion: "1.0.16", FirstRegisteredAt: time.Unix(1700000000, 0).UTC(), LastSeenAt: time.Unix(1700000300, 0).UTC()})
	fn, url := newFakeFunction(t)
	var mu sync.Mutex
	early := 0 // batch events that came before the device record was written
	fn.invocation = func(n int, w http.ResponseWriter) bool {
		if n > 3 {
			return false
		}
		w.Header().Set("X-Amz-Function-Error", "Unhandled")
		_, _ = io.WriteString(w, `{"errorMessage":"boom","errorType":"runtime.Error"}`)
		return true
	}
	fn.event = func(batchIDs []string, w http.ResponseWriter) bool {
		if len(batchIDs) > 0 && devices.written() == 0 {
			mu.Lock()
			early++
			mu.Unlock()
		}
		return false
	}
	up, _ := newLambdaUplink(t, buf, url, uplink.Config{}, uplink.Deps{Devices: devices})
	runUntil(t, up, func() bool { return buf.Stats().PendingBatches == 0 && devices.written() == 1 })
	mu.Lock()
	defer mu.Unlock()
	require.Zero(t, early, "a batch went to the function before its device record was written")
}
