package uplink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/internal/adaptive"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/stretchr/testify/require"
)

func TestAdaptiveWait(t *testing.T) {
	const maxWait = 100 * time.Millisecond
	tests := []struct {
		name      string
		rate      float64
		maxWait   time.Duration
		target    float64
		steepness float64
		want      time.Duration
		delta     time.Duration
	}{
		{"no arrivals: at once", 0, maxWait, 20, 0.25, 0, 0},
		{"negative rate: at once", -3, maxWait, 20, 0.25, 0, 0},
		{"NaN rate: at once", nanRate(), maxWait, 20, 0.25, 0, 0},
		{"one batch a second: almost at once", 1, maxWait, 20, 0.25, 200 * time.Microsecond, 100 * time.Microsecond},
		{"at the target: half", 20, maxWait, 20, 0.25, 50 * time.Millisecond, 500 * time.Microsecond},
		{"far above the target: max", 200, maxWait, 20, 0.25, maxWait, 0},
		{"infinite rate: max", posInf(), maxWait, 20, 0.25, maxWait, 0},
		{"no max wait: never waits", 1000, 0, 20, 0.25, 0, 0},
		{"flat sigmoid: never waits", 1000, maxWait, 20, 0, 0, 0},
		{"steep: below target near 0", 15, maxWait, 20, 2, 0, 100 * time.Microsecond},
		{"steep: above target near max", 25, maxWait, 20, 2, maxWait, 100 * time.Microsecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := adaptiveWait(tt.rate, tt.maxWait, tt.target, tt.steepness)
			require.InDelta(t, float64(tt.want), float64(got), float64(tt.delta), "got %v", got)
			require.GreaterOrEqual(t, got, time.Duration(0))
			require.LessOrEqual(t, got, max(tt.maxWait, 0))
		})
	}
}

func nanRate() float64 { var z float64; return z / z }
func posInf() float64  { var z float64; return 1 / z }

// TestAdaptiveWaitPinned pins the round's wait and the uplink's rate
// estimate to the figures they gave before they were built on
// internal/adaptive, to the nanosecond and to the last bit; the rate
// sequence has counts at the last count's instant and before it.
func TestAdaptiveWaitPinned(t *testing.T) {
	const ms = time.Millisecond
	waits := []struct {
		rate      float64
		maxWait   time.Duration
		target    float64
		steepness float64
		want      time.Duration
	}{
		{1, 100 * ms, 20, 0.25, 189733},
		{5, 100 * ms, 20, 0.25, 1639424},
		{13.7, 100 * ms, 20, 0.25, 16592241},
		{20, 100 * ms, 20, 0.25, 49663103},
		{31, 100 * ms, 20, 0.25, 93950849},
		{50, 100 * ms, 20, 0.25, 99944350},
		{18, 100 * ms, 20, 2, 1798621},
		{3, time.Second, 10, 0.5, 22771788},
	}
	for _, w := range waits {
		require.Equal(t, w.want, adaptiveWait(w.rate, w.maxWait, w.target, w.steepness), "rate %v", w.rate)
	}
	t0 := time.Unix(1_700_000_000, 0)
	rates := []struct {
		at           time.Duration
		n            int
		now, twoSecs float64
	}{
		{0, 0, 0, 0},
		{100 * ms, 3, 0.5940398007973424, 0.39819678661747654},
		{100 * ms, 2, 0.9940398007973424, 0.6663248050317322},
		{90 * ms, 1, 1.1940398007973425, 0.8019911937126853},
		{1300 * ms, 10, 2.7173661323082685, 1.8215049909045655},
		{7 * time.Second, 0, 0.8690653783515834, 0.5825519444246136},
		{7200 * ms, 25, 5.736308943412723, 3.8451628750230658},
	}
	e := newEWMARate(arrivalTau)
	for _, x := range rates {
		e.add(x.n, t0.Add(x.at))
		require.Equal(t, x.now, e.at(t0.Add(x.at)), "at %v", x.at)
		require.Equal(t, x.twoSecs, e.at(t0.Add(x.at+2*time.Second)), "2s after %v", x.at)
	}
}

func TestETA(t *testing.T) {
	tests := []struct {
		backlog int64
		rate    float64
		want    *float64
	}{
		{0, 0, aws.Float64(0)},
		{0, 5, aws.Float64(0)},
		{100, 0, nil},
		{100, 1e-6, nil},
		{100, 4, aws.Float64(25)},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d at %v", tt.backlog, tt.rate), func(t *testing.T) {
			require.Equal(t, tt.want, eta(tt.backlog, tt.rate))
		})
	}
}

func TestAIMD(t *testing.T) {
	var seen []int
	a := newAIMD(8, 10, func(n int) { seen = append(seen, n) })
	ctx := context.Background()

	// A burst of throttled requests started together halves the limit once.
	var gens []uint64
	for range 8 {
		g, err := a.acquire(ctx)
		require.NoError(t, err)
		gens = append(gens, g)
	}
	for _, g := range gens {
		a.release(g, outcomeThrottled, "", 0)
	}
	require.Equal(t, 4, a.current())

	// Requests started after the decrease may decrease again, down to 1.
	for range 5 {
		g, err := a.acquire(ctx)
		require.NoError(t, err)
		a.release(g, outcomeThrottled, "", 0)
	}
	require.Equal(t, 1, a.current())

	// At the limit, acquire waits.
	g, err := a.acquire(ctx)
	require.NoError(t, err)
	short, cancel := context.WithCancel(ctx)
	cancel()
	_, err = a.acquire(short)
	require.ErrorIs(t, err, context.Canceled)
	a.release(g, outcomeOther, "", 0)
	require.Equal(t, 1, a.current(), "other failures change nothing")

	// Additive increase: one more per limit successes, up to the maximum.
	for range 1000 {
		g, err := a.acquire(ctx)
		require.NoError(t, err)
		a.release(g, outcomeSuccess, "", 0)
	}
	require.Equal(t, 10, a.current())
	require.Equal(t, []int{8, 4, 2, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, seen)
}

func TestThrottledAndAmbiguous(t *testing.T) {
	status := func(code int) error {
		return &smithyhttp.ResponseError{Response: &smithyhttp.Response{Response: &http.Response{StatusCode: code}}, Err: errors.New("x")}
	}
	tests := []struct {
		name      string
		err       error
		throttled bool
		ambiguous bool
		// unreachable: no answer came (Run probes before the next round)
		unreachable bool
	}{
		{"throughput", &types.ProvisionedThroughputExceededException{Message: aws.String("x")}, true, false, false},
		{"request limit", &types.RequestLimitExceeded{Message: aws.String("x")}, true, false, false},
		{"500", status(500), true, true, false},
		{"503", status(503), true, true, false},
		{"400", status(400), false, true, false},
		{"internal server error", &types.InternalServerError{Message: aws.String("x")}, true, true, false},
		{"transaction throttled", &types.TransactionCanceledException{CancellationReasons: []types.CancellationReason{{Code: aws.String("None")}, {Code: aws.String("ThrottlingError")}}}, true, false, false},
		{"marker exists", &types.TransactionCanceledException{CancellationReasons: []types.CancellationReason{{Code: aws.String("ConditionalCheckFailed")}}}, false, false, false},
		{"validation", &types.ResourceNotFoundException{Message: aws.String("x")}, false, false, false},
		{"timeout", fmt.Errorf("call: %w", context.DeadlineExceeded), false, true, true},
		{"network", errors.New("connection reset by peer"), false, true, false},
		{"unprocessed items", fmt.Errorf("x: %w", errUnprocessed), false, false, false},
		{"request not sent", fmt.Errorf("op: %w", &smithyhttp.RequestSendError{Err: errors.New("connection refused")}), false, true, true},
		{"no answer (the SDK's shape)", &smithyhttp.ResponseError{Response: &smithyhttp.Response{Response: &http.Response{}},
			Err: &smithyhttp.RequestSendError{Err: errors.New("connection refused")}}, false, true, true},
		{"connection failed", &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}, false, true, true},
		{"canceled", fmt.Errorf("call: %w", context.Canceled), false, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.throttled, throttled(tt.err))
			require.Equal(t, tt.ambiguous, ambiguous(tt.err))
			require.Equal(t, tt.unreachable, unreachable(tt.err))
		})
	}
}

// TestStoppedDrainReadsZero: the drain rate decays after the last
// delivery and reads 0 once none came for drainStopped.
func TestStoppedDrainReadsZero(t *testing.T) {
	e := &ewmaRate{rate: adaptive.Rate{Tau: drainTau}, stopAfter: drainStopped}
	t0 := time.Now()
	e.add(0, t0)
	for i := 1; i <= 100; i++ {
		e.add(1, t0.Add(time.Duration(i)*100*time.Millisecond))
	}
	end := t0.Add(10 * time.Second)
	if e.at(end) <= 0 {
		t.Fatalf("draining: %v", e.at(end))
	}
	if got := e.at(end.Add(drainStopped)); got != 0 {
		t.Fatalf("nothing delivered for %v: got %v, want 0", drainStopped, got)
	}
}

func TestLingerWaitsForTheOldestBatchUpToMaxDelay(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name     string
		maxDelay time.Duration
		pending  int64
		age      time.Duration
		want     time.Duration
	}{
		{"a fresh batch waits the whole delay", 5 * time.Second, 1, 0, 5 * time.Second},
		{"the wait counts from the oldest batch", 5 * time.Second, 3, 2 * time.Second, 3 * time.Second},
		{"an old batch goes at once", 5 * time.Second, 3, time.Minute, 0},
		{"enough batches go at once", 5 * time.Second, 100, 0, 0},
		{"nothing pending, no wait", 5 * time.Second, 0, 0, 0},
		{"a negative delay never waits", -time.Second, 1, 0, 0},
		{"a clock that went back waits no longer than the delay", 5 * time.Second, 1, -time.Hour, 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := &Uplink{cfg: Config{MaxDelay: tc.maxDelay, MaxBatchSize: 100}}
			st := buffer.Stats{PendingBatches: tc.pending}
			if tc.pending > 0 {
				st.Oldest = now.Add(-tc.age)
			}
			require.Equal(t, tc.want, u.linger(st, now))
		})
	}
}
