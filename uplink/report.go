package uplink

import (
	"time"

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
	// DrainRateBatches is the recent delivery rate in batches per second.
	DrainRateBatches float64 `json:"drain_rate_batches_per_second"`
	// ETASeconds estimates the time to drain the backlog at the recent rate;
	// nil when there is a backlog but no recent delivery to estimate from.
	ETASeconds *float64 `json:"eta_seconds"`
	// LastError is the last failure (kept after recovery, with its time).
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
	// FailedRounds counts failed rounds since the uplink went down.
	FailedRounds int `json:"failed_rounds"`
	// LastDeliveryAt is when a batch was last delivered.
	LastDeliveryAt *time.Time `json:"last_delivery_at,omitempty"`
}

// backlogSource is implemented by stores that can tell their backlog
// (*buffer.Buffer).
type backlogSource interface {
	Stats() buffer.Stats
}

// Report returns the uplink's state and backlog for operators.
func (u *Uplink) Report() Report {
	st := u.Status()
	r := Report{State: "up", Since: st.Since, LastError: st.LastError, FailedRounds: st.Failures}
	if !st.Up {
		r.State = "down"
	}
	if s, ok := u.store.(backlogSource); ok {
		bs := s.Stats()
		r.BacklogBatches, r.BacklogBytes = bs.PendingBatches, bs.PendingBytes
		if !bs.Oldest.IsZero() {
			r.OldestAgeSeconds = max(0, u.clock.Now().Sub(bs.Oldest).Seconds())
		}
	}
	return r
}
