package function

import "greenhouse-gateway/function/event"

// The native batch event's types and constants are defined in package
// event, which the gateway's uplink imports without the function's code.
type (
	BatchEvent    = event.BatchEvent
	BatchItem     = event.BatchItem
	DeviceItem    = event.DeviceItem
	KeyItem       = event.KeyItem
	BatchResponse = event.BatchResponse
	ItemResult    = event.ItemResult
)

const (
	KindGatewayBatches = event.KindGatewayBatches
	EventVersion       = event.EventVersion
	StatusDelivered    = event.StatusDelivered
	StatusDuplicate    = event.StatusDuplicate
	StatusConflict     = event.StatusConflict
	StatusRejected     = event.StatusRejected
	StatusThrottled    = event.StatusThrottled
	StatusError        = event.StatusError
)

// decodeBatchEvent reads a gateway_batches event, plain or compressed.
var decodeBatchEvent = event.Unmarshal
