package function_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/function"
	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/harness/faultproxy"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/tablewrite"
)

func nativeEvent(t testing.TB, batches map[string]*contract.Batch, order []string) function.BatchEvent {
	ev := function.BatchEvent{V: 1, Kind: function.KindGatewayBatches, GatewayID: "gw-1"}
	for _, id := range order {
		ev.Items = append(ev.Items, function.BatchItem{ID: id, Batch: json.RawMessage(jsonOf(t, batches[id]))})
	}
	return ev
}

func byID(results []function.ItemResult) map[string]function.ItemResult {
	m := map[string]function.ItemResult{}
	for _, r := range results {
		m[r.ID] = r
	}
	return m
}

func TestStatusesAreTheWritersOutcomes(t *testing.T) {
	for o, s := range map[tablewrite.Outcome]string{tablewrite.Delivered: function.StatusDelivered,
		tablewrite.Duplicate: function.StatusDuplicate, tablewrite.Conflict: function.StatusConflict,
		tablewrite.Rejected: function.StatusRejected, tablewrite.Throttled: function.StatusThrottled, tablewrite.Failed: function.StatusError} {
		require.Equal(t, s, o.String())
	}
}

func TestNativeEventUnderTheEmulator(t *testing.T) {
	r := newRig(t, nil)
	hw := "AA:BB:CC:00:15:11"
	batches := map[string]*contract.Batch{
		"c-1": batch(hw, base(), 0, 3, 21), "c-2": batch(hw, base(), 5, 20, 21), // 20 readings: split from the marker
		"c-3": batch("AA:BB:CC:00:15:12", base(), 0, 1, 21),
	}
	ev := nativeEvent(t, batches, []string{"c-1", "c-2", "c-3"})
	// A repaired batch, as the gateway buffers it.
	repaired := batch(hw, base(), 10, 1, 21)
	repaired.Readings[0].TimeSource = contract.TimeSourceGateway
	ev.Items = append(ev.Items, function.BatchItem{ID: "c-4", Batch: json.RawMessage(jsonOf(t, repaired))},
		function.BatchItem{ID: "c-5", Batch: json.RawMessage(`{"batch_id":"x"}`)})
	now := time.Now().UTC().Truncate(time.Second)
	ev.Devices = []function.DeviceItem{{ID: "d-1", Upsert: cloud.DeviceUpsert{HardwareID: hw, ConfirmationID: "550e8400-e29b-41d4-a716-446655440000",
		FirmwareVersion: "1.0.16", LastBootID: testBoot, FirstRegisteredAt: now, LastSeenAt: now}}}
	_, key, err := cloud.NewKey(testPepper, now)
	require.NoError(t, err)
	key.HardwareID = hw
	ev.Keys = []function.KeyItem{{ID: "k-1", Write: cloud.KeyWrite{Key: key}}}

	var resp function.BatchResponse
	r.invoke(t, ev, &resp)
	require.Equal(t, 1, resp.V)
	require.Len(t, resp.Results, 7, "one result per id")
	got := byID(resp.Results)
	for _, id := range []string{"c-1", "c-2", "c-3", "c-4", "d-1", "k-1"} {
		require.Equal(t, function.StatusDelivered, got[id].Status, "%s: %+v", id, got[id])
	}
	require.Len(t, got["c-2"].Quality, 20)
	require.Equal(t, function.StatusRejected, got["c-5"].Status)
	require.Equal(t, string(contract.ReasonValidation), got["c-5"].Reason)
	require.NotEmpty(t, got["c-5"].Message)

	require.Len(t, r.items(t, hw), 24)
	info, found, err := cloud.NewKeys(r.db, r.tables.APIKeys, testPepper).LookupHash(context.Background(), key.Hash)
	require.NoError(t, err)
	require.True(t, found && info.Active && info.HardwareID == hw, "the device key is in api_keys")

	// A replay is duplicate; another payload under a batch_id is a conflict.
	batches["c-1"] = batch(hw, base(), 0, 3, 35)
	var again function.BatchResponse
	r.invoke(t, nativeEvent(t, batches, []string{"c-1", "c-2"}), &again)
	got = byID(again.Results)
	require.Equal(t, function.StatusConflict, got["c-1"].Status)
	require.Equal(t, string(contract.ReasonConflict), got["c-1"].Reason)
	require.Equal(t, function.StatusDuplicate, got["c-2"].Status)
	require.Len(t, r.items(t, hw), 24, "nothing written twice")
}

// TestKilledEmulatorMidInvocationThenRetryIsExactlyOnce kills the
// emulator (and the function) while it writes a native event whose
// DynamoDB requests are slowed down, restarts it and invokes the same
// event again, as the gateway's uplink does: every batch ends up in the
// tables once, with one marker each.
func TestKilledEmulatorMidInvocationThenRetryIsExactlyOnce(t *testing.T) {
	local := dynamotest.Shared(t)
	slow := faultproxy.Start(t, local.Endpoint, 0)
	require.NoError(t, slow.Set(faultproxy.Fault{Mode: faultproxy.Latency, Delay: 100 * time.Millisecond}))
	r := newRig(t, map[string]string{"DYNAMODB_ENDPOINT": slow.URL(), "WRITE_CONCURRENCY": "2"})

	batches := map[string]*contract.Batch{}
	var order []string
	for d := range 8 {
		for w := range 3 {
			id := fmt.Sprintf("c-%d-%d", d, w)
			batches[id] = batch(fmt.Sprintf("AA:BB:CC:00:16:%02d", d), base(), w*10, 5, 21)
			order = append(order, id)
		}
	}
	ev := nativeEvent(t, batches, order)
	payload, err := json.Marshal(ev)
	require.NoError(t, err)

	var wg sync.WaitGroup
	wg.Go(func() {
		ictx, icancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer icancel()
		_, err := r.em.Invoke(ictx, payload)
		assert.Error(t, err, "the invocation dies with the emulator")
	})
	// Kill once the first markers are going up: most of the event is not
	// written yet.
	deadline := time.Now().Add(20 * time.Second)
	for r.marker(t, batches["c-0-0"].BatchID) == nil {
		require.True(t, time.Now().Before(deadline), "no marker written within 20s:\n%s", r.em.Output())
		time.Sleep(5 * time.Millisecond)
	}
	r.em.Kill()
	wg.Wait()
	partial := countMarkers(t, r, batches)
	require.Less(t, partial, len(batches), "the kill came mid-invocation")

	require.NoError(t, slow.Set(faultproxy.Fault{}))
	require.NoError(t, r.em.Restart())
	var resp function.BatchResponse
	r.invoke(t, ev, &resp)
	for _, res := range resp.Results {
		require.Contains(t, []string{function.StatusDelivered, function.StatusDuplicate}, res.Status, "%+v", res)
	}
	require.Equal(t, len(batches), countMarkers(t, r, batches))
	for d := range 8 {
		require.Len(t, r.items(t, fmt.Sprintf("AA:BB:CC:00:16:%02d", d)), 15, "each reading once")
	}
	t.Logf("%d of %d markers were written before the kill", partial, len(batches))
}

func countMarkers(t *testing.T, r *rig, batches map[string]*contract.Batch) int {
	n := 0
	for _, b := range batches {
		if r.marker(t, b.BatchID) != nil {
			n++
		}
	}
	return n
}

// TestThrottlingAnswers429AndThrottled throttles every DynamoDB request:
// devices get 429 with Retry-After, gateways "throttled" per id, and
// both go through once DynamoDB recovers.
func TestThrottlingAnswers429AndThrottled(t *testing.T) {
	local := dynamotest.Shared(t)
	proxy := faultproxy.Start(t, local.Endpoint, 0)
	r := newRig(t, map[string]string{"DYNAMODB_ENDPOINT": proxy.URL()})
	hw := "AA:BB:CC:00:15:21"
	b := batch(hw, base(), 0, 2, 21)

	require.NoError(t, proxy.Set(faultproxy.Fault{Mode: faultproxy.Throttle}))
	code, body := r.post(t, "/v1/readings", r.key, nil, jsonOf(t, b))
	require.Equal(t, 429, code, body)
	var resp function.BatchResponse
	r.invoke(t, nativeEvent(t, map[string]*contract.Batch{"c-1": b}, []string{"c-1"}), &resp)
	require.Equal(t, function.StatusThrottled, resp.Results[0].Status, "%+v", resp.Results[0])

	require.NoError(t, proxy.Set(faultproxy.Fault{}))
	r.invoke(t, nativeEvent(t, map[string]*contract.Batch{"c-1": b}, []string{"c-1"}), &resp)
	require.Equal(t, function.StatusDelivered, resp.Results[0].Status)
	code, body = r.post(t, "/v1/readings", r.key, nil, jsonOf(t, b))
	require.Equal(t, 200, code, body)
	require.Contains(t, body, `"duplicate"`)
}

// TestABatchAfterItsDevicesFailedLookupIsNotAttempted has the first of an
// event's two marker lookups fail (its BatchGetItem answered 500 by a
// proxy in front of DynamoDB Local): device x's first batch, in that
// lookup, fails; its second, 100 batches later in the lookup that
// succeeds, must not overtake it.
func TestABatchAfterItsDevicesFailedLookupIsNotAttempted(t *testing.T) {
	local := dynamotest.Shared(t)
	x := "AA:BB:CC:00:1B:01"
	first := batch(x, base(), 0, 2, 21)
	target, err := url.Parse(local.Endpoint)
	require.NoError(t, err)
	forward := httputil.NewSingleHostReverseProxy(target)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if strings.HasSuffix(req.Header.Get("X-Amz-Target"), ".BatchGetItem") && strings.Contains(string(body), first.BatchID) {
			w.Header().Set("Content-Type", "application/x-amz-json-1.0")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(`{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"injected"}`))
			return
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		forward.ServeHTTP(w, req)
	}))
	defer proxy.Close()
	r := newRig(t, map[string]string{"DYNAMODB_ENDPOINT": proxy.URL})

	batches := map[string]*contract.Batch{"x-1": first, "x-2": batch(x, base(), 5, 2, 21)}
	order := []string{"x-1"}
	for i := range 99 {
		id := fmt.Sprintf("o-%d", i)
		batches[id] = batch(fmt.Sprintf("AA:BB:CC:00:1C:%02X", i), base(), 0, 1, 21)
		order = append(order, id)
	}
	order = append(order, "x-2")
	var resp function.BatchResponse
	r.invoke(t, nativeEvent(t, batches, order), &resp)
	got := byID(resp.Results)
	require.Contains(t, []string{function.StatusError, function.StatusThrottled}, got["x-1"].Status, "%+v", got["x-1"])
	require.Equal(t, function.StatusError, got["x-2"].Status, "%+v", got["x-2"])
	require.Equal(t, "not_attempted", got["x-2"].Reason, "%+v", got["x-2"])
	require.Empty(t, r.items(t, x), "neither of x's batches is written")
}
