package uplink_test

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/uplink"
)

func (f *fakeFunction) answeredReports() []answeredReport {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]answeredReport(nil), f.reports...)
}

// TestLambdaTargetReportsItsStateInEveryEvent checks the report each event
// carries: the first the function answers holds the whole backlog and the
// class of the failures before it, the deliveries are each counted once
// (an unanswered report's count goes in the next one), and an idle uplink
// keeps reporting in empty events.
func TestLambdaTargetReportsItsStateInEveryEvent(t *testing.T) {
	buf := openBuffer(t)
	fleetBacklog(t, buf, 4, 3)
	fn, url := newFakeFunction(t)
	fn.invocation = func(n int, w http.ResponseWriter) bool {
		if n > 2 {
			return false
		}
		w.Header().Set("X-Amzn-ErrorType", "TooManyRequestsException")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, `{"Type":"User","message":"Rate Exceeded."}`)
		return true
	}
	up, _ := newLambdaUplink(t, buf, url, uplink.Config{Lambda: uplink.LambdaConfig{MaxItems: 2, Concurrency: 1,
		MaxConcurrency: 1, ReportInterval: 20 * time.Millisecond}}, uplink.Deps{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- up.Run(ctx) }()
	idle := func(rs []answeredReport) int {
		n := 0
		for _, r := range rs {
			if r.items == 0 && r.report.PendingBatches == 0 {
				n++
			}
		}
		return n
	}
	require.Eventually(t, func() bool { return idle(fn.answeredReports()) >= 3 }, 60*time.Second, 5*time.Millisecond)
	cancel()
	require.NoError(t, <-done)

	reports := fn.answeredReports()
	first := reports[0].report
	require.NotNil(t, first)
	require.Equal(t, int64(12), first.PendingBatches, "the whole backlog")
	require.Positive(t, first.OldestPendingAgeSeconds)
	require.Zero(t, first.DeliveredBatches)
	require.Equal(t, "invocation_throttled", first.LastErrorClass, "why it waited")
	delivered := int64(0)
	for i, r := range reports {
		require.NotNil(t, r.report, "every event carries the report")
		delivered += r.report.DeliveredBatches
		if i > 0 {
			require.Empty(t, r.report.LastErrorClass, "the class went in the first answered report")
		}
	}
	require.Equal(t, int64(12), delivered, "every delivery reported once")
	last := reports[len(reports)-1].report
	require.Zero(t, last.PendingBatches)
	require.Zero(t, last.OldestPendingAgeSeconds)
}
