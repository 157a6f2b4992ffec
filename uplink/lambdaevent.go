package uplink

import (
	"encoding/json"

	"greenhouse-gateway/internal/cloud"
)

// The native batch event of the readings function, as the common brief of
// issue 15 fixes it. These types stand in for the function's own until
// they are merged; only one definition may remain.

// eventKind tells the native batch event from an API Gateway event.
const eventKind = "gateway_batches"

// batchEvent is one invocation's event.
type batchEvent struct {
	V         int           `json:"v"`
	Kind      string        `json:"kind"`
	GatewayID string        `json:"gateway_id"`
	Items     []eventItem   `json:"items,omitempty"`
	Devices   []eventDevice `json:"devices,omitempty"`
	Keys      []eventKey    `json:"keys,omitempty"`
}

// eventItem is one device batch, exactly as the device contract's JSON.
type eventItem struct {
	ID    string          `json:"id"`
	Batch json.RawMessage `json:"batch"`
}

type eventDevice struct {
	ID     string             `json:"id"`
	Upsert cloud.DeviceUpsert `json:"upsert"`
}

type eventKey struct {
	ID    string         `json:"id"`
	Write cloud.KeyWrite `json:"write"`
}

// batchAnswer is the function's answer: one result per id.
type batchAnswer struct {
	V       int          `json:"v"`
	Results []itemResult `json:"results"`
}

type itemResult struct {
	ID      string    `json:"id"`
	Status  string    `json:"status"`
	Reason  string    `json:"reason,omitempty"`
	Message string    `json:"message,omitempty"`
	Quality []float64 `json:"quality,omitempty"`
}

// Result statuses.
const (
	statusDelivered = "delivered"
	statusDuplicate = "duplicate"
	statusConflict  = "conflict"
	statusRejected  = "rejected"
	statusThrottled = "throttled"
	statusError     = "error"
)
