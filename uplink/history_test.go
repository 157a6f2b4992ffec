package uplink_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/function/event"
	"greenhouse-gateway/internal/tablewrite"
	"greenhouse-gateway/uplink"
)

// The lambda target's events carry a device's history hint once the
// function has answered delivered for HistoryLen of its readings: the
// newest HistoryLen of them by device_readings' sort key. A batch answered
// otherwise (error here) makes the gateway forget the device: its next
// event has no hint until HistoryLen readings are delivered again.
func TestLambdaTargetSendsTheDeliveredHistory(t *testing.T) {
	buf := openBuffer(t)
	const devices, perDevice, readings = 3, 16, 3
	batches := map[string]*contract.Batch{}
	var failing string // device 0's ninth batch, answered error at its first sending
	for i := range perDevice {
		var round []*contract.Batch
		for d := range devices {
			b := seqBatch(t, fmt.Sprintf("AA:BB:CC:00:34:%02X", d), i, readings)
			batches[b.BatchID] = b
			if i == 8 && d == 0 {
				failing = b.BatchID
			}
			round = append(round, b)
		}
		store(t, buf, round...)
	}
	fn, url := newFakeFunction(t)
	fn.status = func(batchID string, k int) string {
		if batchID == failing && k == 1 {
			return "error"
		}
		return ""
	}
	var (
		inCloud   = map[string][]string{} // by device: batch_ids delivered, in order
		since     = map[string]int{}      // by device: readings delivered since its last error
		failed    bool
		hints     int
		afterFail = -1 // readings delivered since the failure when the failing device's next hint came
	)
	// Events reach seen one at a time (one invocation in flight) and carry
	// one batch each, so the model follows the answers.
	// seen runs on the fake function's handler goroutine: assert, not
	// require (t.FailNow must be called from the test's goroutine).
	fn.seen = func(ev event.BatchEvent) {
		for _, h := range ev.History {
			hints++
			assert.GreaterOrEqual(t, since[h.HardwareID], event.HistoryLen, "a hint only of readings delivered since the last error")
			var all []sortedReading
			for _, id := range inCloud[h.HardwareID] {
				for _, r := range batches[id].Readings {
					all = append(all, sortedReading{tablewrite.TSBatch(r.TimestampMS, id), r})
				}
			}
			slices.SortFunc(all, func(a, b sortedReading) int { return strings.Compare(a.key, b.key) })
			if !assert.GreaterOrEqual(t, len(all), event.HistoryLen) || !assert.Len(t, h.Readings, event.HistoryLen) {
				continue
			}
			want := all[len(all)-event.HistoryLen:]
			for i, r := range h.Readings {
				assert.Equal(t, want[i].r.TimestampMS, r.TimestampMS, "hint reading %d of %s", i, h.HardwareID)
				assert.Equal(t, want[i].r.Sensors, r.Sensors)
			}
			if h.HardwareID == batches[failing].HardwareID && failed && afterFail < 0 {
				afterFail = since[h.HardwareID]
			}
		}
		for _, it := range ev.Items {
			var b contract.Batch
			if !assert.NoError(t, json.Unmarshal(it.Batch, &b)) {
				continue
			}
			if b.BatchID == failing && !failed {
				failed, since[b.HardwareID] = true, 0
				continue
			}
			inCloud[b.HardwareID] = append(inCloud[b.HardwareID], b.BatchID)
			since[b.HardwareID] += len(b.Readings)
		}
	}
	cfg := uplink.Config{Lambda: uplink.DefaultConfig().Lambda}
	cfg.Lambda.MaxItems, cfg.Lambda.Concurrency, cfg.Lambda.MaxConcurrency = 1, 1, 1
	up, _ := newLambdaUplink(t, buf, url, cfg, uplink.Deps{})
	runUntilEmpty(t, up, buf)
	delivered, _, _ := fn.snapshot()
	require.Len(t, delivered, devices*perDevice)
	require.Positive(t, hints, "hints are sent")
	require.GreaterOrEqual(t, afterFail, event.HistoryLen, "after the failure, no hint until HistoryLen readings were delivered again")
}

type sortedReading struct {
	key string
	r   contract.Reading
}
