package uplink

import (
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"greenhouse-gateway/buffer"
)

// Report is what operators see of the uplink (GET /v1/uplink, the status
// page, gatewayctl status). Durations are in seconds in JSON.
type Report struct {
	// State is "up" while forwarding works, "down" while rounds fail.
	State string `json:"state"`
	// Since is when State last changed.
	Since time.Time `json:"since"`
	// BacklogBatches and BacklogBytes are what waits in the buffer.
	BacklogBatches int64 `json:"backlog_batches"`
	BacklogBytes   int64 `json:"backlog_bytes"`
	// OldestAgeSeconds is the age of the oldest waiting batch (0 when none).
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	// DrainRateBatches is the recent delivery rate in batches per second,
	// exponentially weighted (time constant 30 s) and decaying while
	// nothing is delivered.
	DrainRateBatches float64 `json:"drain_rate_batches_per_second"`
	// ETASeconds estimates the time to drain the backlog at the recent rate
	// (0 without a backlog); nil when there is a backlog but no recent
	// delivery to estimate from.
	ETASeconds *float64 `json:"eta_seconds"`
	// LastError is the last failure (kept after recovery, with its time).
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
	// FailedRounds counts failed rounds since the uplink went down.
	FailedRounds int `json:"failed_rounds"`
	// LastDeliveryAt is when a batch was last delivered.
	LastDeliveryAt *time.Time `json:"last_delivery_at,omitempty"`
	// ArrivalRateBatches is the recent rate at which batches were queued,
	// in batches per second (time constant 5 s); it sets the adaptive wait.
	ArrivalRateBatches float64 `json:"arrival_rate_batches_per_second"`
	// Concurrency is how many DynamoDB requests may be in flight now.
	Concurrency int `json:"concurrency"`
}

// minRate is the drain rate below which no ETA is given.
const minRate = 1e-3

// backlogSource is implemented by stores that can tell their backlog
// (*buffer.Buffer).
type backlogSource interface {
	Stats() buffer.Stats
}

// Report returns the uplink's state and backlog for operators.
func (u *Uplink) Report() Report {
	st := u.Status()
	r := Report{State: "up", Since: st.Since, FailedRounds: st.Failures}
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
	if s, ok := u.store.(backlogSource); ok {
		bs := s.Stats()
		r.BacklogBatches, r.BacklogBytes = bs.PendingBatches, bs.PendingBytes
		if !bs.Oldest.IsZero() {
			r.OldestAgeSeconds = max(0, u.clock.Now().Sub(bs.Oldest).Seconds())
		}
	}
	now := time.Now()
	r.DrainRateBatches = u.drain.at(now)
	r.ArrivalRateBatches = u.arrivals.at(now)
	r.ETASeconds = eta(r.BacklogBatches, r.DrainRateBatches)
	r.Concurrency = u.limiter.current()
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
	f := promauto.With(u.metrics.reg)
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "gateway", Subsystem: "uplink", Name: "drain_rate_batches_per_second",
		Help: "Recent delivery rate, batches per second (exponentially weighted, 30 s time constant).",
	}, func() float64 { return u.drain.at(time.Now()) })
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "gateway", Subsystem: "uplink", Name: "drain_eta_seconds",
		Help: "Estimated time to drain the backlog at the recent delivery rate: 0 without a backlog, +Inf with a backlog and no recent delivery.",
	}, func() float64 {
		backlog := int64(0)
		if s, ok := u.store.(backlogSource); ok {
			backlog = s.Stats().PendingBatches
		}
		if v := eta(backlog, u.drain.at(time.Now())); v != nil {
			return *v
		}
		return math.Inf(1)
	})
}
