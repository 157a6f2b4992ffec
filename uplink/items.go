package uplink

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/clock"
)

// markerTTL is the lifetime of a processed_batches marker (schema 002).
const markerTTL = 30 * 24 * time.Hour

// rfc3339 is the schema's metadata timestamp format: UTC, whole seconds.
const rfc3339 = "2006-01-02T15:04:05Z"

// cloudBatch is one buffered batch turned into the items the contract
// writes: one device_readings item per reading and the processed_batches
// marker.
type cloudBatch struct {
	pending  buffer.Pending
	readings []map[string]types.AttributeValue
	marker   map[string]types.AttributeValue
}

// buildBatch decodes a buffered payload into its table items. now sets the
// marker's expiration time.
func buildBatch(p buffer.Pending, readingsRetention time.Duration, now time.Time) (*cloudBatch, error) {
	var b contract.Batch
	if err := json.Unmarshal(p.Payload, &b); err != nil {
		return nil, fmt.Errorf("decoding buffered batch %s: %w", p.BatchID, err)
	}
	if b.BatchID != p.BatchID {
		return nil, fmt.Errorf("buffered batch %s holds batch_id %q", p.BatchID, b.BatchID)
	}
	cb := &cloudBatch{pending: p}
	cb.readings = make([]map[string]types.AttributeValue, 0, len(b.Readings))
	for i, r := range b.Readings {
		cb.readings = append(cb.readings, readingItem(&b, r, readingsRetention))
		// The buffer's history keeps the batch under its reading times
		// when it is marked delivered.
		if i == 0 || r.TimestampMS < cb.pending.FirstMS {
			cb.pending.FirstMS = r.TimestampMS
		}
		if i == 0 || r.TimestampMS > cb.pending.LastMS {
			cb.pending.LastMS = r.TimestampMS
		}
	}
	cb.pending.SpanKnown = len(b.Readings) > 0
	received := p.ReceivedAt
	if received.Before(clock.DefaultFloor) {
		// Stamped by a clock that was not set yet: the forwarding time is
		// the best receive time there is.
		received = now
	}
	cb.marker = map[string]types.AttributeValue{
		"batch_id":        s(b.BatchID),
		"hardware_id":     s(b.HardwareID),
		"received_at":     s(received.UTC().Format(rfc3339)),
		"expiration_time": n(strconv.FormatInt(now.Add(markerTTL).Unix(), 10)),
	}
	return cb, nil
}

// TSBatch is the device_readings sort key: the 13-digit zero-padded
// timestamp, '#', and the batch_id.
func TSBatch(timestampMS int64, batchID string) string {
	return fmt.Sprintf("%013d#%s", timestampMS, batchID)
}

func readingItem(b *contract.Batch, r contract.Reading, retention time.Duration) map[string]types.AttributeValue {
	sensors := make(map[string]types.AttributeValue, len(r.Sensors))
	for k, v := range r.Sensors {
		sensors[k] = n(strconv.FormatFloat(v, 'g', -1, 64))
	}
	status := make(map[string]types.AttributeValue, len(r.SensorStatus))
	for k, v := range r.SensorStatus {
		status[k] = s(v)
	}
	item := map[string]types.AttributeValue{
		"hardware_id":      s(b.HardwareID),
		"ts_batch":         s(TSBatch(r.TimestampMS, b.BatchID)),
		"timestamp_ms":     n(strconv.FormatInt(r.TimestampMS, 10)),
		"batch_id":         s(b.BatchID),
		"boot_id":          s(b.BootID),
		"firmware_version": s(b.FirmwareVersion),
		"sensors":          &types.AttributeValueMemberM{Value: sensors},
		"sensor_status":    &types.AttributeValueMemberM{Value: status},
		"expiration_time":  n(strconv.FormatInt(r.TimestampMS/1000+int64(retention/time.Second), 10)),
	}
	if r.TimeSource != "" {
		item["time_source"] = s(r.TimeSource)
	}
	return item
}

func s(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
func n(v string) types.AttributeValue { return &types.AttributeValueMemberN{Value: v} }
