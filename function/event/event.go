// Package event holds the readings function's native batch event and its
// answer: the wire contract between a gateway's uplink (uplink.target
// lambda) and the function. It is a leaf package, so that the gateway
// links these types and not the function's table access.
package event

import (
	"encoding/json"

	"greenhouse-gateway/firmware-contract/quality"
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
	// Report is the gateway's uplink state when it sent the event; nil
	// from a gateway that does not report (the function then emits no
	// gateway metrics for the event).
	Report *UplinkReport `json:"report,omitempty"`
	// History holds, per device of Items, the newest readings the gateway
	// has seen the function deliver for it (HistoryHint); nil from a
	// gateway that sends none.
	History []HistoryHint `json:"history,omitempty"`
}

// HistoryLen is how many readings a HistoryHint carries: the quality
// checks' history (quality.HistoryLen).
const HistoryLen = quality.HistoryLen

// HistoryHint is one device's newest HistoryLen readings in
// device_readings, oldest first, as the gateway knows them: the readings
// of the batches the function answered delivered or duplicate since the
// gateway started, while no other answer for the device came between.
//
//	"history":[{"hardware_id":"d-1","readings":[{"timestamp_ms":1700000000000,"sensors":{"t":21.5}},...]}]
//
// Under the ordering rule accept_older the function uses a hint of
// exactly HistoryLen readings instead of reading the device's newest
// readings; it affects only the readings' quality scores and the log line
// of a batch older than the device's newest reading. Under reject_older,
// or without a hint (a gateway's first batches of a device after its
// start), the function reads them.
type HistoryHint struct {
	HardwareID string           `json:"hardware_id"`
	Readings   []HistoryReading `json:"readings"`
}

// HistoryReading is one reading of a HistoryHint: its time and sensor
// values.
type HistoryReading struct {
	TimestampMS int64              `json:"timestamp_ms"`
	Sensors     map[string]float64 `json:"sensors"`
}

// UplinkReport is a gateway's uplink state, carried by every event it
// sends, its empty-event probes and idle reports included, so that the
// cloud sees each gateway's backlog without reaching the gateway:
//
//	"report":{"pending_batches":120,"oldest_pending_age_s":42.5,
//	          "delivered_batches":300,"last_error_class":"unreachable"}
type UplinkReport struct {
	// PendingBatches is how many batches the gateway holds for the cloud.
	PendingBatches int64 `json:"pending_batches"`
	// OldestPendingAgeSeconds is how long the oldest of them has waited
	// since the gateway received it; 0 without a backlog.
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_s"`
	// DeliveredBatches counts the batches the gateway recorded as in the
	// cloud since the last report the function answered (so each
	// delivery is reported once when invocations succeed).
	DeliveredBatches int64 `json:"delivered_batches"`
	// LastErrorClass is the class of the gateway's last uplink failure (an
	// invocation, a batch's or device record's result, a round) since the
	// last report the function answered; empty when none failed. One of
	// ErrorClasses.
	LastErrorClass string `json:"last_error_class,omitempty"`
}

// ErrorClasses are the values of UplinkReport.LastErrorClass: unreachable
// (no answer: network, timeout), invocation_throttled (Lambda refused the
// invocation: TooManyRequestsException, 429), function_error (the
// function failed), invocation_error (any other failed invocation),
// throttled (the function answered throttled for a batch), cloud_error
// (the function answered error, or no result, for a batch), gateway (the
// gateway's own side: its buffer, its clock).
var ErrorClasses = []string{"unreachable", "invocation_throttled", "function_error", "invocation_error",
	"throttled", "cloud_error", "gateway"}

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
