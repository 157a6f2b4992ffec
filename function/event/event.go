// Package event holds the readings function's native batch event and its
// answer: the wire contract between a gateway's uplink (uplink.target
// lambda) and the function. It is a leaf package, so that the gateway
// links these types and not the function's table access.
package event

import (
	"encoding/json"

	"greenhouse-gateway/internal/cloud"
)

// KindGatewayBatches is the "kind" of the native batch event a gateway's
// uplink invokes the function with.
const KindGatewayBatches = "gateway_batches"

// EventVersion is the "v" of native events and their answers.
const EventVersion = 1

// BatchEvent is the native batch event: device batches with correlation
// ids, and the device records and device keys the gateway has to write.
//
//	{"v":1,"kind":"gateway_batches","gateway_id":"gw-1",
//	 "items":[{"id":"c-1","batch":{...one device batch as the device contract's JSON...}}],
//	 "devices":[{"id":"d-1","upsert":{...cloud.DeviceUpsert...}}],
//	 "keys":[{"id":"k-1","write":{...cloud.KeyWrite...}}]}
//
// A device's batches are written in event order: when one is neither in
// the cloud nor refused for good (throttled, error), its later batches in
// the event are not attempted and answer error. A gateway may therefore
// put several consecutive batches of a device in one event, but never a
// device's batches in two events in flight at once.
type BatchEvent struct {
	V         int          `json:"v"`
	Kind      string       `json:"kind"`
	GatewayID string       `json:"gateway_id"`
	Items     []BatchItem  `json:"items"`
	Devices   []DeviceItem `json:"devices,omitempty"`
	Keys      []KeyItem    `json:"keys,omitempty"`
}

// BatchItem is one device batch of a BatchEvent.
type BatchItem struct {
	ID    string          `json:"id"`
	Batch json.RawMessage `json:"batch"`
}

// DeviceItem is one devices-table upsert of a BatchEvent.
type DeviceItem struct {
	ID     string             `json:"id"`
	Upsert cloud.DeviceUpsert `json:"upsert"`
}

// KeyItem is one api_keys write of a BatchEvent.
type KeyItem struct {
	ID    string         `json:"id"`
	Write cloud.KeyWrite `json:"write"`
}

// Item statuses of a BatchResponse: what the gateway does with the item.
const (
	// StatusDelivered: written now; the gateway marks it delivered.
	StatusDelivered = "delivered"
	// StatusDuplicate: already in the cloud, same payload; delivered too.
	StatusDuplicate = "duplicate"
	// StatusConflict: its batch_id is in the cloud with another payload;
	// the gateway dead-letters it.
	StatusConflict = "conflict"
	// StatusRejected: the cloud refuses its content for good (validation,
	// timestamp_conflict, a DynamoDB validation error); dead letter.
	StatusRejected = "rejected"
	// StatusThrottled: DynamoDB throttled; back off and retry.
	StatusThrottled = "throttled"
	// StatusError: anything else; retry.
	StatusError = "error"
)

// BatchResponse answers a BatchEvent: exactly one result per id of its
// items, devices and keys, items first, in event order.
type BatchResponse struct {
	V       int          `json:"v"`
	Results []ItemResult `json:"results"`
}

// ItemResult is the outcome of one id of a BatchEvent.
type ItemResult struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	// Reason is the contract reason of a rejected or conflicting batch, or
	// the kind of error ("throttled", "dynamodb", "not_attempted").
	Reason string `json:"reason,omitempty"`
	// Message names the field and the rule, or says what failed.
	Message string `json:"message,omitempty"`
	// Quality holds the quality score of each reading of a delivered
	// batch, in reading order.
	Quality []float64 `json:"quality,omitempty"`
}
