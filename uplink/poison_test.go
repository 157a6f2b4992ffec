package uplink_test

import (
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/uplink"
)

// crashOn answers an invocation with the Runtime Interface Emulator's
// function error, as the function's process exiting does.
func crashOn(w http.ResponseWriter) {
	_, _ = io.WriteString(w, `{"errorMessage":"RequestId: x Error: Runtime exited with error: exit status 2","errorType":"Runtime.ExitError"}`)
}

func TestLambdaTargetIsolatesABatchTheFunctionCrashesOn(t *testing.T) {
	buf := openBuffer(t)
	want := fleetBacklog(t, buf, 6, 4)
	victim := "AA:BB:CC:00:00:00"
	poison := want[victim][1]
	fn, url := newFakeFunction(t)
	var (
		mu          sync.Mutex
		lone        int  // invocations of the poison batch alone
		othersFirst bool // every other device's batch was delivered before the poison's second lone invocation
		wentDown    atomic.Bool
	)
	var up *uplink.Uplink
	fn.event = func(ids []string, w http.ResponseWriter) bool {
		if !up.Status().Up {
			wentDown.Store(true)
		}
		if !slices.Contains(ids, poison) {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		if len(ids) == 1 {
			if lone++; lone == 2 {
				delivered, _, _ := fn.snapshot()
				othersFirst = len(delivered) == 6*4-4+1
			}
		}
		crashOn(w)
		return true
	}
	up, reg := newLambdaUplink(t, buf, url, uplink.Config{Lambda: uplink.LambdaConfig{PoisonFailures: 3}}, uplink.Deps{})
	runUntilEmpty(t, up, buf)

	delivered, _, _ := fn.snapshot()
	got := perDevice(delivered)
	require.Len(t, delivered, 6*4-1, "every batch but the poison delivered, each once")
	for hw, ids := range want {
		if hw == victim {
			require.Equal(t, []string{ids[0], ids[2], ids[3]}, got[hw], "the device's later batches go on after its poison batch, in order")
			continue
		}
		require.Equal(t, ids, got[hw], "per-device order: %s", hw)
	}
	mu.Lock()
	require.Equal(t, 3, lone, "dead-lettered at the third failure of the batch alone")
	require.True(t, othersFirst, "the other devices' batches were delivered while the poison was isolated")
	mu.Unlock()
	require.False(t, wentDown.Load(), "not down while other batches are delivered, nor while the function answers all but the poison batch")
	dead, n, err := buf.DeadLetters(0)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, poison, dead[0].BatchID)
	require.Contains(t, dead[0].Reason, "Runtime.ExitError")
	require.LessOrEqual(t, metricValue(reg, "gateway_uplink_lambda_results_total", "duplicate"), 0.0, "nothing delivered twice")
	require.Positive(t, metricValue(reg, "gateway_uplink_lambda_invocation_splits_total", ""))
}

func TestLambdaTargetDeadLettersABatchAnsweredErrorWhileOthersAreDelivered(t *testing.T) {
	buf := openBuffer(t)
	want := fleetBacklog(t, buf, 4, 3)
	victim := "AA:BB:CC:00:00:02"
	poison := want[victim][0]
	fn, url := newFakeFunction(t)
	fn.status = func(id string, _ int) string {
		if id == poison {
			return "error"
		}
		return ""
	}
	up, reg := newLambdaUplink(t, buf, url, uplink.Config{Lambda: uplink.LambdaConfig{PoisonFailures: 4, PoisonTime: time.Millisecond}}, uplink.Deps{})
	runUntilEmpty(t, up, buf)

	delivered, _, _ := fn.snapshot()
	got := perDevice(delivered)
	require.Equal(t, want[victim][1:], got[victim], "its device's later batches go on")
	for hw, ids := range want {
		if hw != victim {
			require.Equal(t, ids, got[hw])
		}
	}
	fn.mu.Lock()
	require.Equal(t, 4, fn.sent[poison], "dead-lettered at the fourth error")
	fn.mu.Unlock()
	dead, n, err := buf.DeadLetters(0)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, poison, dead[0].BatchID)
	require.Contains(t, dead[0].Reason, "the function answered error")
	require.LessOrEqual(t, metricValue(reg, "gateway_uplink_lambda_results_total", "duplicate"), 0.0, "nothing delivered twice")
}

// TestLambdaTargetBlamesNoBatchForAnOutage: a function that fails on
// every invocation, whatever it carries (a function error, an HTTP 5xx,
// an error result for every batch), dead-letters nothing, even at two
// failures allowed (one may follow a batch as the outage ends, when its
// invocation fails while another, a moment later, delivers), and every
// batch is delivered once it recovers.
func TestLambdaTargetBlamesNoBatchForAnOutage(t *testing.T) {
	for _, fault := range []string{"function_error", "5xx", "error_results"} {
		t.Run(fault, func(t *testing.T) {
			buf := openBuffer(t)
			want := fleetBacklog(t, buf, 5, 3)
			fn, url := newFakeFunction(t)
			var failing atomic.Int32
			failing.Store(40)
			var up *uplink.Uplink
			var wentDown atomic.Bool
			fn.event = func(ids []string, w http.ResponseWriter) bool {
				if failing.Add(-1) < 0 {
					return false
				}
				if !up.Status().Up {
					wentDown.Store(true)
				}
				switch fault {
				case "function_error":
					crashOn(w)
				case "5xx":
					http.Error(w, `{"Type":"Service","message":"internal"}`, http.StatusInternalServerError)
				default:
					return false
				}
				return true
			}
			fn.status = func(string, int) string {
				if fault == "error_results" && failing.Load() > 0 {
					return "error"
				}
				return ""
			}
			up, _ = newLambdaUplink(t, buf, url, uplink.Config{Lambda: uplink.LambdaConfig{PoisonFailures: 2}}, uplink.Deps{})
			runUntilEmpty(t, up, buf)

			delivered, _, _ := fn.snapshot()
			require.Equal(t, want, perDevice(delivered), "every batch delivered once, in order")
			_, n, err := buf.DeadLetters(0)
			require.NoError(t, err)
			require.Zero(t, n, "an outage dead-letters nothing")
			require.True(t, wentDown.Load(), "nothing delivered: the uplink is down")
		})
	}
}
