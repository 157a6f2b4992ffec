// Package delivery holds the uplink's report as operators see it: the
// uplink fills it, the operator API and status page show it, gatewayctl
// reads it from GET /v1/uplink. It imports only the standard library, so
// that none of them depends on another for the type.
package delivery

import "time"

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
	// Concurrency is how many DynamoDB requests (with the lambda target:
	// invocations) may be in flight now.
	Concurrency int `json:"concurrency"`
}
