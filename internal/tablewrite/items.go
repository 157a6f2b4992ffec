// Package tablewrite writes device batches to the cloud tables of the
// locked schema (002): one device_readings item per reading and the
// processed_batches marker, as one idempotent unit. The
// gateway's uplink and the readings function both write through it, so
// the tables hold the same items whichever path a batch took.
//
// A batch goes up in one TransactWriteItems when its readings and marker
// fit the endpoint's per-transaction item limit; otherwise its marker is
// looked up, then its readings go first (deterministic keys make a replay
// an identical overwrite) and the marker last. Many batches can share BatchWriteItem requests
// (WriteBulk, WriteLookedUp). A batch DynamoDB refuses leaves none of its
// readings in the table: those that accepted requests wrote are deleted. The marker carries the batch's payload hash (an optional
// attribute): a marker already there answers Duplicate when its hash is
// the batch's (or it has none, as markers written before the hash), and
// Conflict when it differs.
package tablewrite

import (
	"encoding/hex"
	"fmt"
	"slices"
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

// Items is a batch turned into its table items. Its reading items are
// made when they are first needed: as attribute maps (readingMaps), or
// encoded (Encode) for the bulk writer. An Items is used by one goroutine
// at a time.
type Items struct {
	BatchID    string
	HardwareID string
	hash       string
	src        Batch
	retention  time.Duration
	// readings are the attribute maps, once made.
	readings []map[string]types.AttributeValue
	// encoded holds the readings' AWS JSON encodings one after the other,
	// reading i at encoded[ends[i-1]:ends[i]], once made.
	encoded []byte
	ends    []int
	marker  map[string]types.AttributeValue
}

// Readings is the number of device_readings items.
func (it *Items) Readings() int {
	if it.src.Batch == nil {
		return 0
	}
	return len(it.src.Batch.Readings)
}

// Build turns b into its table items: readings expire retention after
// their timestamp, the marker MarkerTTL after now. The reading items are
// made from b's batch and quality scores when first needed: they must not
// change while the Items is in use.
func Build(b Batch, retention time.Duration, now time.Time) *Items {
	cb := b.Batch
	it := &Items{BatchID: cb.BatchID, HardwareID: cb.HardwareID, src: b, retention: retention}
	if b.Hash != ([32]byte{}) {
		it.hash = hex.EncodeToString(b.Hash[:])
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

// readingMaps returns the device_readings items as attribute maps, made
// on the first call.
func (it *Items) readingMaps() []map[string]types.AttributeValue {
	if it.readings != nil || it.src.Batch == nil {
		return it.readings
	}
	cb := it.src.Batch
	it.readings = make([]map[string]types.AttributeValue, 0, len(cb.Readings))
	// The attributes every reading of the batch shares, built once: no
	// item is changed after it is made.
	shared := batchAttributes{hardwareID: s(cb.HardwareID), batchID: s(cb.BatchID), bootID: s(cb.BootID),
		firmwareVersion: s(cb.FirmwareVersion)}
	for i, r := range cb.Readings {
		item := readingItem(cb.BatchID, shared, r, it.retention)
		if len(it.src.Quality) == len(cb.Readings) {
			item[AttrQualityScore] = n(strconv.FormatFloat(it.src.Quality[i], 'g', -1, 64))
		}
		it.readings = append(it.readings, item)
	}
	return it.readings
}

// Encode makes the reading items' AWS JSON encodings, the same items as
// readingMaps (attributes in another order), without the maps: the bulk
// writer sends them as they are (cloud.EncodedItem). It returns the
// encodings of readings 0 to n-1, in order; they are made on the first
// call.
func (it *Items) Encode() [][]byte {
	it.encode()
	out := make([][]byte, len(it.ends))
	start := 0
	for i, end := range it.ends {
		out[i] = it.encoded[start:end:end]
		start = end
	}
	return out
}

// encode makes the encodings Encode returns, once.
func (it *Items) encode() {
	if it.ends == nil && it.src.Batch != nil {
		it.encoded, it.ends = encodeReadings(it.src, it.retention)
	}
}

// drop lets go of the batch and its reading items.
func (it *Items) drop() {
	it.src = Batch{}
	it.readings, it.encoded, it.ends = nil, nil, nil
}

// encodeReadings encodes b's readings one after the other and returns
// the bytes with the end of each reading's encoding.
func encodeReadings(b Batch, retention time.Duration) ([]byte, []int) {
	cb := b.Batch
	// The attributes every reading shares, encoded once.
	var shared []byte
	for _, a := range [...]struct{ name, value string }{
		{"hardware_id", cb.HardwareID}, {"batch_id", cb.BatchID}, {"boot_id", cb.BootID}, {"firmware_version", cb.FirmwareVersion},
	} {
		shared = append(contract.AppendJSONString(shared, a.name), `:{"S":`...)
		shared = append(contract.AppendJSONString(shared, a.value), "},"...)
	}
	// The batch_id as it follows '#' in ts_batch, escaped, without quotes.
	id := contract.AppendJSONString(nil, cb.BatchID)
	id = id[1 : len(id)-1]
	quality := len(b.Quality) == len(cb.Readings)
	expiresAfter := int64(retention / time.Second)
	ends := make([]int, 0, len(cb.Readings))
	var out []byte
	for i, r := range cb.Readings {
		if i == 1 {
			// The first reading's size, for the rest.
			out = slices.Grow(out, (len(cb.Readings)-1)*len(out)*9/8)
		}
		out = append(out, '{')
		out = append(out, shared...)
		out = append(out, `"ts_batch":{"S":"`...)
		if r.TimestampMS < 0 {
			ts := contract.AppendJSONString(nil, TSBatch(r.TimestampMS, cb.BatchID))
			out = append(out, ts[1:len(ts)-1]...)
		} else {
			var digits [20]byte
			d := strconv.AppendInt(digits[:0], r.TimestampMS, 10)
			for range 13 - len(d) {
				out = append(out, '0')
			}
			out = append(append(append(out, d...), '#'), id...)
		}
		out = append(out, `"},"timestamp_ms":{"N":"`...)
		out = strconv.AppendInt(out, r.TimestampMS, 10)
		out = append(out, `"},"sensors":{"M":{`...)
		first := true
		for k, v := range r.Sensors {
			if !first {
				out = append(out, ',')
			}
			first = false
			out = append(contract.AppendJSONString(out, k), `:{"N":"`...)
			out = append(strconv.AppendFloat(out, v, 'g', -1, 64), `"}`...)
		}
		out = append(out, `}},"sensor_status":{"M":{`...)
		first = true
		for k, v := range r.SensorStatus {
			if !first {
				out = append(out, ',')
			}
			first = false
			out = append(contract.AppendJSONString(out, k), `:{"S":`...)
			out = append(contract.AppendJSONString(out, v), '}')
		}
		out = append(out, `}},"expiration_time":{"N":"`...)
		out = append(strconv.AppendInt(out, r.TimestampMS/1000+expiresAfter, 10), `"}`...)
		if r.TimeSource != "" {
			out = append(contract.AppendJSONString(append(out, `,"time_source":{"S":`...), r.TimeSource), '}')
		}
		if quality {
			out = append(out, `,"`+AttrQualityScore+`":{"N":"`...)
			out = append(strconv.AppendFloat(out, b.Quality[i], 'g', -1, 64), `"}`...)
		}
		out = append(out, '}')
		ends = append(ends, len(out))
	}
	return out, ends
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
func (it *Items) ReadingItems() []map[string]types.AttributeValue { return it.readingMaps() }

// MarkerItem returns the processed_batches item (not a copy).
func (it *Items) MarkerItem() map[string]types.AttributeValue { return it.marker }
