package uplink

import (
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus/promauto"

	"greenhouse-gateway/internal/delivery"
)

// minRate is the drain rate below which no ETA is given.
const minRate = 1e-3

// Report returns the uplink's state and backlog for operators.
func (u *Uplink) Report() delivery.Report {
	st := u.Status()
	r := delivery.Report{State: "up", Since: st.Since, FailedRounds: st.Failures}
	if !st.Up {
		r.State = "down"
	}
	u.mu.Lock()
	r.LastError = u.lastErr
	if !u.lastErrAt.IsZero() {
		at := u.lastErrAt
		r.LastErrorAt = &at
	}
	if !u.lastDelivery.IsZero() {
		at := u.lastDelivery
		r.LastDeliveryAt = &at
	}
	u.mu.Unlock()
	bs := u.store.Stats()
	r.BacklogBatches, r.BacklogBytes = bs.PendingBatches, bs.PendingBytes
	if !bs.Oldest.IsZero() {
		r.OldestAgeSeconds = max(0, u.clock.Now().Sub(bs.Oldest).Seconds())
	}
	now := time.Now()
	r.DrainRateBatches = u.drain.at(now)
	r.ArrivalRateBatches = u.arrivals.at(now)
	r.ETASeconds = eta(r.BacklogBatches, r.DrainRateBatches)
	r.Concurrency = u.limiter.current()
	if u.lambda != nil {
		r.Concurrency = u.lambda.limiter.current()
	}
	return r
}

// eta is backlog/rate in seconds: 0 without a backlog, nil when the rate
// is too low to estimate from.
func eta(backlog int64, rate float64) *float64 {
	var v float64
	switch {
	case backlog <= 0:
	case rate < minRate:
		return nil
	default:
		v = float64(backlog) / rate
	}
	return &v
}

// registerReportMetrics exports the drain figures, computed at scrape time.
func (u *Uplink) registerReportMetrics() {
	f := factory{promauto.With(u.metrics.reg)}
	f.gaugeFunc("drain_rate_batches_per_second",
		"Recent delivery rate, batches per second (exponentially weighted, 30 s time constant); 0 once nothing was delivered for 15 s.",
		func() float64 { return u.drain.at(time.Now()) })
	f.gaugeFunc("drain_eta_seconds",
		"Estimated time to drain the backlog at the recent delivery rate: 0 without a backlog, +Inf with a backlog and no recent delivery.",
		func() float64 {
			if v := eta(u.store.Stats().PendingBatches, u.drain.at(time.Now())); v != nil {
				return *v
			}
			return math.Inf(1)
		})
}
