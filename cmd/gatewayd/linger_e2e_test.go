package main

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
)

// liveRequests sends a live greenhouse's traffic in miniature through a
// gatewayd with uplink.max_delay delay: 12 devices, one batch of 10
// readings each, 300 ms apart, and returns the DynamoDB requests the
// uplink made to deliver them (every acknowledged batch checked in the
// tables once).
func liveRequests(t *testing.T, delay string) float64 {
	t.Helper()
	local, view, key, prefix := setup(t)
	d := startDaemon(t, t.TempDir(), local.Endpoint, prefix, "GATEWAY_UPLINK_MAX_DELAY="+delay)
	l := &ackedLoad{acked: map[string]int{}}
	var hws []string
	for i := range 12 {
		hw := fmt.Sprintf("02:00:00:C4:01:%02X", i)
		hws = append(hws, hw)
		code, _, results := postBatches(t, d, key, [][]byte{batch(hw, uuid.NewString(), 0, 10)})
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, contract.StatusAccepted, results[0].Status)
		l.add(results[0].BatchID, 10)
		time.Sleep(300 * time.Millisecond)
	}
	require.Eventually(t, func() bool { return d.metric(t, "gateway_buffer_pending_batches") == "0" },
		60*time.Second, 100*time.Millisecond, "logs:\n%s", d.logs.String())
	checkExactlyOnce(t, view, hws, l)
	requests := 0.0
	for _, op := range []string{"BatchGetItem", "BatchWriteItem", "TransactWriteItems", "PutItem"} {
		if v := d.metric(t, `gateway_uplink_request_duration_seconds_count{operation="`+op+`"}`); v != "" {
			requests += metricFloat(t, d, `gateway_uplink_request_duration_seconds_count{operation="`+op+`"}`)
		}
	}
	return requests
}

// TestLiveBatchesWaitForEachOtherOnTheLink: at a live rate, with
// uplink.max_delay, batches of several devices travel in the same
// requests, so the uplink makes far fewer requests (each with its ~720 B
// of signed headers) than when every batch goes alone.
func TestLiveBatchesWaitForEachOtherOnTheLink(t *testing.T) {
	alone := liveRequests(t, "-1s")
	together := liveRequests(t, "10s")
	t.Logf("DynamoDB requests for 12 batches: %.0f one batch at a time, %.0f with max_delay 10s", alone, together)
	require.GreaterOrEqual(t, alone, 24.0, "alone, each batch takes its marker lookup and its writes")
	require.LessOrEqual(t, together, alone/3, "together, the batches share lookups and full writes")
}
