// Package tablewrite writes device batches to the cloud tables of the
// locked schema (002): one device_readings item per reading and the
// conditional processed_batches marker, as one idempotent unit. The
// gateway's uplink and the readings function both write through it, so
// the tables hold the same items whichever path a batch took.
//
// A batch goes up in one TransactWriteItems when its readings and marker
// fit the endpoint's per-transaction item limit; otherwise its marker is
// looked up, then its readings go first (deterministic keys make a replay
// an identical overwrite) and the marker last. Many batches can share BatchWriteItem requests
// (WriteWave, WriteBulk). A batch DynamoDB refuses leaves none of its
// readings in the table: those that accepted requests wrote are deleted. The marker carries the batch's payload hash (an optional
// attribute): a marker already there answers Duplicate when its hash is
// the batch's (or it has none, as markers written before the hash), and
// Conflict when it differs.
package tablewrite

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"greenhouse-gateway/firmware-contract"
)

// MarkerTTL is the lifetime of a processed_batches marker (schema 002).
const MarkerTTL = 30 * 24 * time.Hour

// rfc3339 is the schema's metadata timestamp format: UTC, whole seconds.
const rfc3339 = "2006-01-02T15:04:05Z"

// Optional attributes this package adds to the locked tables.
const (
	// AttrPayloadHash is the marker's hex SHA-256 of the batch's identity
	// encoding (contract.Batch.IdentityHash).
	AttrPayloadHash = "payload_hash"
	// AttrQualityScore is a reading's quality score in [0,1].
	AttrQualityScore = "quality_score"
)

// Batch is one decoded device batch to write.
type Batch struct {
	Batch *contract.Batch
	// ReceivedAt is when the batch was first received: the marker's
	// received_at.
	ReceivedAt time.Time
	// Hash is contract.Batch.IdentityHash of the batch as the device sent
	// it; the zero value writes no payload_hash.
	Hash [32]byte
	// Quality holds one score per reading, in reading order, stored as
	// quality_score; nil stores none.
	Quality []float64
}

// Items is a batch turned into its table items.
type Items struct {
	BatchID    string
	HardwareID string
	hash       string
	readings   []map[string]types.AttributeValue
	marker     map[string]types.AttributeValue
}

// Readings is the number of device_readings items.
func (it *Items) Readings() int { return len(it.readings) }

// Build turns b into its table items: readings expire retention after
// their timestamp, the marker MarkerTTL after now.
func Build(b Batch, retention time.Duration, now time.Time) *Items {
	cb := b.Batch
	it := &Items{BatchID: cb.BatchID, HardwareID: cb.HardwareID}
	if b.Hash != ([32]byte{}) {
		it.hash = hex.EncodeToString(b.Hash[:])
	}
	it.readings = make([]map[string]types.AttributeValue, 0, len(cb.Readings))
	// The attributes every reading of the batch shares, built once: no
	// item is changed after Build.
	shared := batchAttributes{hardwareID: s(cb.HardwareID), batchID: s(cb.BatchID), bootID: s(cb.BootID),
		firmwareVersion: s(cb.FirmwareVersion)}
	for i, r := range cb.Readings {
		item := readingItem(cb.BatchID, shared, r, retention)
		if len(b.Quality) == len(cb.Readings) {
			item[AttrQualityScore] = n(strconv.FormatFloat(b.Quality[i], 'g', -1, 64))
		}
		it.readings = append(it.readings, item)
	}
	it.marker = map[string]types.AttributeValue{
		"batch_id":        s(cb.BatchID),
		"hardware_id":     s(cb.HardwareID),
		"received_at":     s(b.ReceivedAt.UTC().Format(rfc3339)),
		"expiration_time": n(strconv.FormatInt(now.Add(MarkerTTL).Unix(), 10)),
	}
	if it.hash != "" {
		it.marker[AttrPayloadHash] = s(it.hash)
	}
	return it
}

// SamePayload reports whether a marker whose payload_hash is stored (hex;
// "" for a marker written without one) stands for a batch of identity
// hash h.
func SamePayload(stored string, h [32]byte) bool {
	return stored == "" || stored == hex.EncodeToString(h[:])
}

// TSBatch is the device_readings sort key: the 13-digit zero-padded
// timestamp, '#', and the batch_id.
func TSBatch(timestampMS int64, batchID string) string {
	if timestampMS < 0 {
		return fmt.Sprintf("%013d#%s", timestampMS, batchID)
	}
	var digits [20]byte
	d := strconv.AppendInt(digits[:0], timestampMS, 10)
	out := make([]byte, 0, max(13, len(d))+1+len(batchID))
	for range 13 - len(d) {
		out = append(out, '0')
	}
	out = append(append(append(out, d...), '#'), batchID...)
	return string(out)
}

// batchAttributes are the reading attributes that come from the batch.
type batchAttributes struct {
	hardwareID, batchID, bootID, firmwareVersion types.AttributeValue
}

// readingAttributes is the most attributes a reading item has: the
// schema's ten and quality_score.
const readingAttributes = 11

func readingItem(batchID string, shared batchAttributes, r contract.Reading, retention time.Duration) map[string]types.AttributeValue {
	sensors := make(map[string]types.AttributeValue, len(r.Sensors))
	for k, v := range r.Sensors {
		sensors[k] = n(strconv.FormatFloat(v, 'g', -1, 64))
	}
	status := make(map[string]types.AttributeValue, len(r.SensorStatus))
	for k, v := range r.SensorStatus {
		status[k] = s(v)
	}
	item := make(map[string]types.AttributeValue, readingAttributes)
	item["hardware_id"] = shared.hardwareID
	item["ts_batch"] = s(TSBatch(r.TimestampMS, batchID))
	item["timestamp_ms"] = n(strconv.FormatInt(r.TimestampMS, 10))
	item["batch_id"] = shared.batchID
	item["boot_id"] = shared.bootID
	item["firmware_version"] = shared.firmwareVersion
	item["sensors"] = &types.AttributeValueMemberM{Value: sensors}
	item["sensor_status"] = &types.AttributeValueMemberM{Value: status}
	item["expiration_time"] = n(strconv.FormatInt(r.TimestampMS/1000+int64(retention/time.Second), 10))
	if r.TimeSource != "" {
		item["time_source"] = s(r.TimeSource)
	}
	return item
}

func s(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
func n(v string) types.AttributeValue { return &types.AttributeValueMemberN{Value: v} }

// ReadingItems returns the device_readings items (not copies).
func (it *Items) ReadingItems() []map[string]types.AttributeValue { return it.readings }

// MarkerItem returns the processed_batches item (not a copy).
func (it *Items) MarkerItem() map[string]types.AttributeValue { return it.marker }
