package contract

import (
	"crypto/sha256"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"
)

// Canonical returns the deterministic JSON encoding of b: compact, members in
// the order of the struct fields, map keys sorted, numbers in their shortest
// form that reads back to the same float64. The same logical batch gives the
// same bytes whatever the key order, whitespace, escapes or number spelling of
// the payload it was decoded from.
//
// For a valid batch the bytes are those of encoding/json.Marshal(b), except
// that nil maps are written as {}; they decode with [DecodeBatch] to an equal
// batch (unless the batch was repaired: devices may not send time_source, so
// read repaired batches back with encoding/json).
func (b *Batch) Canonical() []byte {
	return b.appendJSON(make([]byte, 0, b.sizeHint()), true)
}

// PayloadHash returns the SHA-256 of a canonical encoding.
func PayloadHash(canonical []byte) [32]byte {
	return sha256.Sum256(canonical)
}

// IdentityHash returns the SHA-256 of b's canonical encoding without
// sent_uptime_ms, the one field that legitimately changes when a device
// resends the same batch. Two payloads with the same batch_id are the same
// batch (a duplicate) when their identity hashes are equal, and a conflict
// otherwise. Compute it before [Batch.RepairClock].
func (b *Batch) IdentityHash() [32]byte {
	scratch := scratchPool.Get().(*[]byte)
	dst := b.appendJSON((*scratch)[:0], false)
	id := sha256.Sum256(dst)
	if cap(dst) <= maxScratch {
		*scratch = dst
		scratchPool.Put(scratch)
	}
	return id
}

// CanonicalIdentity returns [Batch.Canonical] and [Batch.IdentityHash] from
// one encoding: the identity hash covers the canonical bytes around the
// sent_uptime_ms member, which is exactly the encoding without it. Call it
// before [Batch.RepairClock], as IdentityHash. The canonical bytes are
// encoded in a pooled scratch buffer and returned in a slice of their exact
// length.
func (b *Batch) CanonicalIdentity() ([]byte, [32]byte) {
	scratch := scratchPool.Get().(*[]byte)
	dst := b.appendHead((*scratch)[:0])
	cut := len(dst)
	dst = b.appendSentUptime(dst)
	resume := len(dst)
	dst = b.appendReadings(dst)
	canonical := slices.Clone(dst)
	// Cut sent_uptime_ms out of the scratch copy and hash the rest.
	n := cut + copy(dst[cut:], dst[resume:])
	id := sha256.Sum256(dst[:n])
	if cap(dst) <= maxScratch {
		*scratch = dst
		scratchPool.Put(scratch)
	}
	return canonical, id
}

// scratchPool holds encoding buffers of CanonicalIdentity and
// IdentityHash; those grown
// beyond maxScratch (batches far larger than usual) are left to the GC.
var scratchPool = sync.Pool{New: func() any {
	b := make([]byte, 0, 4096)
	return &b
}}

const maxScratch = 64 << 10

// sizeHint is the length of b's canonical encoding, or a little more, so
// that encoding it allocates once. Numbers are counted at their longest
// plain form (24 bytes), strings without escapes.
func (b *Batch) sizeHint() int {
	n := len(`{"batch_id":"","hardware_id":"","boot_id":"","firmware_version":"","seq":,"sent_uptime_ms":,"readings":[]}`) +
		len(b.BatchID) + len(b.HardwareID) + len(b.BootID) + len(b.FirmwareVersion) + 2*20
	for k := range b.Readings {
		r := &b.Readings[k]
		n += len(`{"timestamp_ms":,"uptime_ms":,"sensors":{},"sensor_status":{},"time_source":""},`) + 2*20 + len(r.TimeSource)
		for name := range r.Sensors {
			n += len(name) + len(`"":,`) + 24
		}
		for name, st := range r.SensorStatus {
			n += len(name) + len(st) + len(`"":"",`)
		}
	}
	return n
}

func (b *Batch) appendJSON(dst []byte, withSentUptime bool) []byte {
	dst = b.appendHead(dst)
	if withSentUptime {
		dst = b.appendSentUptime(dst)
	}
	return b.appendReadings(dst)
}

// appendHead writes the members before sent_uptime_ms.
func (b *Batch) appendHead(dst []byte) []byte {
	dst = append(dst, `{"batch_id":`...)
	dst = AppendJSONString(dst, b.BatchID)
	dst = append(dst, `,"hardware_id":`...)
	dst = AppendJSONString(dst, b.HardwareID)
	dst = append(dst, `,"boot_id":`...)
	dst = AppendJSONString(dst, b.BootID)
	dst = append(dst, `,"firmware_version":`...)
	dst = AppendJSONString(dst, b.FirmwareVersion)
	if b.Seq != nil {
		dst = append(dst, `,"seq":`...)
		dst = strconv.AppendUint(dst, *b.Seq, 10)
	}
	return dst
}

// appendSentUptime writes the sent_uptime_ms member, if any.
func (b *Batch) appendSentUptime(dst []byte) []byte {
	if b.SentUptimeMS != nil {
		dst = append(dst, `,"sent_uptime_ms":`...)
		dst = strconv.AppendInt(dst, *b.SentUptimeMS, 10)
	}
	return dst
}

// appendReadings writes the readings member and closes the object.
func (b *Batch) appendReadings(dst []byte) []byte {
	dst = append(dst, `,"readings":[`...)
	var backing [16]string
	keys := backing[:0] // reused across maps
	for k := range b.Readings {
		r := &b.Readings[k]
		if k > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"timestamp_ms":`...)
		dst = strconv.AppendInt(dst, r.TimestampMS, 10)
		if r.UptimeMS != nil {
			dst = append(dst, `,"uptime_ms":`...)
			dst = strconv.AppendInt(dst, *r.UptimeMS, 10)
		}
		dst = append(dst, `,"sensors":{`...)
		keys = sortedKeys(keys[:0], r.Sensors)
		dst = appendMembers(dst, keys, r.Sensors, appendFloat)
		dst = append(dst, `},"sensor_status":{`...)
		keys = sortedKeys(keys[:0], r.SensorStatus)
		dst = appendMembers(dst, keys, r.SensorStatus, AppendJSONString)
		dst = append(dst, '}')
		if r.TimeSource != "" {
			dst = append(dst, `,"time_source":`...)
			dst = AppendJSONString(dst, r.TimeSource)
		}
		dst = append(dst, '}')
	}
	return append(dst, "]}"...)
}

// appendMembers writes the members of m named by keys, in that order and
// comma-separated, each value written by appendValue.
func appendMembers[V any](dst []byte, keys []string, m map[string]V, appendValue func([]byte, V) []byte) []byte {
	for n, name := range keys {
		if n > 0 {
			dst = append(dst, ',')
		}
		dst = AppendJSONString(dst, name)
		dst = append(dst, ':')
		dst = appendValue(dst, m[name])
	}
	return dst
}

func sortedKeys[V any](dst []string, m map[string]V) []string {
	for k := range m {
		dst = append(dst, k)
	}
	slices.Sort(dst)
	return dst
}

// appendFloat formats f as encoding/json does: the shortest representation
// that reads back as f, in exponent form below 1e-6 and from 1e21.
func appendFloat(dst []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(dst, "null"...) // not valid in a batch; keep the output JSON
	}
	abs := math.Abs(f)
	format := byte('f')
	if abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	dst = strconv.AppendFloat(dst, f, format, -1, 64)
	if format == 'e' {
		// Clean up e-09 to e-9, as encoding/json does.
		n := len(dst)
		if n >= 4 && dst[n-4] == 'e' && dst[n-3] == '-' && dst[n-2] == '0' {
			dst[n-2] = dst[n-1]
			dst = dst[:n-1]
		}
	}
	return dst
}

// AppendJSONString appends s as a JSON string, escaped as encoding/json
// does (the contract's canonical form and acks use it).
func AppendJSONString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // rare: let encoding/json do it
			return append(dst, q...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}
