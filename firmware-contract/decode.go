package contract

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// DecodeBatch decodes and validates one reading batch.
//
// sender is the hardware_id the message came from (the MQTT topic's, or the
// authenticated device's); when it is not empty the batch's hardware_id must
// equal it. now is the gateway's clock for the clock-skew rule; the zero
// time disables that rule. lim's zero fields take their defaults.
//
// A batch whose readings are dated before 2000-01-01 is rejected with
// ReasonClockNotSynced, unless every such reading has uptime_ms and the batch
// has sent_uptime_ms: then DecodeBatch returns it, [Batch.NeedsClockRepair]
// reports true, and the caller repairs it with [Batch.RepairClock].
//
// The error is always an *Error, whose BatchID is set when the payload had a
// string batch_id.
func DecodeBatch(data []byte, sender string, lim Limits, now time.Time) (*Batch, error) {
	b, e := decodeBatch(data, sender, lim, now)
	if e != nil {
		return nil, e
	}
	return b, nil
}

func decodeBatch(data []byte, sender string, lim Limits, now time.Time) (*Batch, *Error) {
	lim = lim.withDefaults()
	b, e := decodeMembers(data, lim, false)
	if e != nil {
		return nil, e
	}
	if e := b.validate(lim, now, sender); e != nil {
		e.BatchID = b.BatchID
		return nil, e
	}
	return b, nil
}

// DecodeStored decodes a batch the gateway encoded for its buffer
// ([Batch.Canonical]). Its syntax, members and types are checked as
// DecodeBatch checks them, but not the limits and value rules: the batch
// met them when it was received, under that day's limits. The error is an
// *Error.
func DecodeStored(data []byte) (*Batch, error) {
	b, e := decodeMembers(data, Limits{MaxReadings: math.MaxInt, MaxSensors: math.MaxInt}, true)
	if e != nil {
		return nil, e
	}
	return b, nil
}

// decodeMembers decodes a batch's members, checking syntax, members and
// types, and lim's counts; stored admits a stored batch's members.
func decodeMembers(data []byte, lim Limits, stored bool) (*Batch, *Error) {
	// One copy of the payload: every string of the batch (IDs, map keys)
	// is a substring of it, so decoding allocates little beyond the maps.
	s := string(data)
	counts, e := checkSyntax(s)
	if e != nil {
		return nil, e
	}
	i := skipWS(s, 0)
	if s[i] != '{' {
		return nil, validationErr("", "a reading batch must be a JSON object, not "+kindName(s, i))
	}
	d := decoder{s: s, lim: lim, counts: counts, stored: stored}
	b := new(Batch)
	if e := d.batch(i, b); e != nil {
		e.BatchID = b.BatchID
		if e.BatchID == "" {
			e.BatchID = d.findBatchID(i)
		}
		return nil, e
	}
	return b, nil
}

// decoder walks a syntactically valid payload and fills the structs, checking
// types, unknown and duplicate keys, null, integer forms and number range.
// Value rules (formats, ranges, uniqueness) are left to validate.
type decoder struct {
	s      string
	lim    Limits
	counts arrayCounts // element counts of the root object's arrays
	// uptimes backs the readings' UptimeMS pointers: one allocation per
	// batch rather than one per reading.
	uptimes    []int64
	readingsAt int // offset of the readings array
	// stored admits what the gateway adds to a batch it stores: a
	// reading's time_source.
	stored bool
}

// Members of a batch. They are decoded in document order; the value rules
// run afterwards in this order (see validate).
const (
	bfBatchID = iota
	bfHardwareID
	bfBootID
	bfFirmwareVersion
	bfSeq
	bfSentUptime
	bfReadings
	numBatchFields
)

var batchFieldNames = [numBatchFields]string{
	"batch_id", "hardware_id", "boot_id", "firmware_version", "seq", "sent_uptime_ms", "readings",
}

func batchField(k string) int {
	switch k {
	case "batch_id":
		return bfBatchID
	case "hardware_id":
		return bfHardwareID
	case "boot_id":
		return bfBootID
	case "firmware_version":
		return bfFirmwareVersion
	case "seq":
		return bfSeq
	case "sent_uptime_ms":
		return bfSentUptime
	case "readings":
		return bfReadings
	}
	return -1
}

var (
	batchAllowed   = strings.Join(batchFieldNames[:], ", ")
	readingAllowed = strings.Join(readingFieldNames[:], ", ")
)

func (d *decoder) batch(i int, b *Batch) *Error {
	s := d.s
	var seen [numBatchFields]bool
	for {
		key, v, more := nextMember(s, i)
		if !more {
			break
		}
		f := batchField(key)
		if f < 0 {
			return validationErr(joinKey("", key), "unknown field: a reading batch has only "+batchAllowed+
				" (unknown fields are rejected so that nothing is silently dropped)")
		}
		if seen[f] {
			return validationErr(key, "duplicate key")
		}
		seen[f] = true
		var e *Error
		switch f {
		case bfBatchID:
			b.BatchID, e = d.str(v, key)
		case bfHardwareID:
			b.HardwareID, e = d.str(v, key)
		case bfBootID:
			b.BootID, e = d.str(v, key)
		case bfFirmwareVersion:
			b.FirmwareVersion, e = d.str(v, key)
		case bfSeq:
			n, rule := d.uint(v)
			if rule != "" {
				return validationErr(key, rule)
			}
			b.Seq = &n
		case bfSentUptime:
			n, rule := d.nonNegInt(v)
			if rule != "" {
				return validationErr(key, rule)
			}
			b.SentUptimeMS = &n
		case bfReadings:
			v, e = d.readings(v, b)
			i = v
			if e != nil {
				return e
			}
			continue
		}
		if e != nil {
			return e
		}
		i = skipValue(s, v)
	}
	for f, ok := range seen {
		if !ok && f != bfSeq && f != bfSentUptime {
			return validationErr(batchFieldNames[f], "is required")
		}
	}
	return nil
}

// findBatchID returns the value of the first "batch_id" member of the object
// at s[i] when it is a string, so that even a rejection can name the batch.
func (d *decoder) findBatchID(i int) string {
	for {
		key, v, more := nextMember(d.s, i)
		if !more {
			return ""
		}
		if key == "batch_id" {
			if d.s[v] != '"' {
				return ""
			}
			return d.stringAt(v)
		}
		i = skipValue(d.s, v)
	}
}

// readings decodes the readings array at s[v] and returns the offset after
// it.
func (d *decoder) readings(v int, b *Batch) (int, *Error) {
	s := d.s
	if s[v] != '[' {
		return 0, validationErr("readings", "must be an array of readings, not "+kindName(s, v))
	}
	d.readingsAt = v
	n := d.counts.get(v) // counted by the syntax check
	if n > d.lim.MaxReadings {
		return 0, validationErr("readings", fmt.Sprintf("must contain at most %d readings", d.lim.MaxReadings))
	}
	if n >= 0 {
		b.Readings = make([]Reading, 0, n)
	}
	i := v
	for k := 0; ; k++ {
		e, more := nextElem(s, i)
		if !more {
			i = e
			break
		}
		if k == d.lim.MaxReadings {
			return 0, validationErr("readings", fmt.Sprintf("must contain at most %d readings", d.lim.MaxReadings))
		}
		b.Readings = append(b.Readings, Reading{})
		end, err := d.reading(e, k, &b.Readings[k])
		if err != nil {
			return 0, err
		}
		i = end
	}
	if b.Readings == nil {
		b.Readings = []Reading{} // an empty array is left to validate
	}
	return i, nil
}

// Members of a reading.
const (
	rfTimestamp = iota
	rfUptime
	rfSensors
	rfSensorStatus
	numReadingFields
)

var readingFieldNames = [numReadingFields]string{"timestamp_ms", "uptime_ms", "sensors", "sensor_status"}

func readingField(k string) int {
	switch k {
	case "timestamp_ms":
		return rfTimestamp
	case "uptime_ms":
		return rfUptime
	case "sensors":
		return rfSensors
	case "sensor_status":
		return rfSensorStatus
	}
	return -1
}

// reading decodes readings[k] at s[v] and returns the offset after it.
func (d *decoder) reading(v, k int, r *Reading) (int, *Error) {
	s := d.s
	prefix := func() string { return joinIndex("readings", k) }
	if s[v] != '{' {
		return 0, validationErr(prefix(), "a reading must be an object, not "+kindName(s, v))
	}
	var seen [numReadingFields]bool
	seenTimeSource := false
	i := v
	for {
		key, vv, more := nextMember(s, i)
		if !more {
			i = vv
			break
		}
		f := readingField(key)
		if f < 0 && key == "time_source" && d.stored {
			// The gateway's own mark on a repaired timestamp.
			if seenTimeSource {
				return 0, validationErr(joinKey(prefix(), key), "duplicate key")
			}
			seenTimeSource = true
			var e *Error
			if r.TimeSource, e = d.str(vv, joinKey(prefix(), key)); e != nil {
				return 0, e
			}
			i = skipValue(s, vv)
			continue
		}
		if f < 0 {
			if key == "time_source" {
				return 0, validationErr(joinKey(prefix(), key),
					"is set by the gateway when it repairs a timestamp; devices must not send it")
			}
			return 0, validationErr(joinKey(prefix(), key), "unknown field: a reading has only "+readingAllowed+
				" (put sensor values inside \"sensors\")")
		}
		if seen[f] {
			return 0, validationErr(joinKey(prefix(), key), "duplicate key")
		}
		seen[f] = true
		var e *Error
		switch f {
		case rfTimestamp:
			r.TimestampMS, e = d.int(vv, k, "timestamp_ms")
			i = skipValue(s, vv)
		case rfUptime:
			n, rule := d.nonNegInt(vv)
			if rule != "" {
				return 0, validationErr(joinKey(prefix(), "uptime_ms"), rule)
			}
			if d.uptimes == nil {
				d.uptimes = make([]int64, max(d.counts.get(d.readingsAt), k+1))
			}
			if k < len(d.uptimes) {
				d.uptimes[k] = n
				r.UptimeMS = &d.uptimes[k]
			} else {
				r.UptimeMS = new(n)
			}
			i = skipValue(s, vv)
		case rfSensors:
			r.Sensors, i, e = d.sensors(vv, k)
		case rfSensorStatus:
			r.SensorStatus, i, e = d.sensorStatus(vv, k)
		}
		if e != nil {
			return 0, e
		}
	}
	if !seen[rfTimestamp] {
		return 0, validationErr(joinKey(prefix(), "timestamp_ms"), "is required")
	}
	if r.Sensors == nil {
		r.Sensors = map[string]float64{}
	}
	if r.SensorStatus == nil {
		r.SensorStatus = map[string]string{}
	}
	return i, nil
}

// sensors decodes readings[k].sensors at s[v] and returns the offset after
// it.
func (d *decoder) sensors(v, k int) (map[string]float64, int, *Error) {
	field := func() string { return joinIndex("readings", k) + ".sensors" }
	return decodeSensorMap(d, v, field, "must be an object mapping sensor names to numbers",
		func(key string, vv int) (float64, int, *Error) {
			return d.sensorValue(vv, func() string { return joinKey(field(), key) })
		})
}

// sensorStatus decodes readings[k].sensor_status at s[v] and returns the
// offset after it.
func (d *decoder) sensorStatus(v, k int) (map[string]string, int, *Error) {
	s := d.s
	field := func() string { return joinIndex("readings", k) + ".sensor_status" }
	return decodeSensorMap(d, v, field, `must be an object mapping sensor names to "ok" or "error"`,
		func(key string, vv int) (string, int, *Error) {
			if s[vv] != '"' {
				return "", 0, validationErr(joinKey(field(), key), `must be "ok" or "error", not `+kindName(s, vv))
			}
			end, _ := skipString(s, vv)
			return d.stringAt(vv), end, nil
		})
}

// decodeSensorMap decodes the object at s[v], field, that maps sensor
// names to values, at most lim.MaxSensors of them, and returns the offset
// after it; value decodes the value of key at s[vv] and returns the offset
// after it. want is the rule for a value at s[v] that is not an object.
func decodeSensorMap[V any](d *decoder, v int, field func() string, want string,
	value func(key string, vv int) (V, int, *Error)) (map[string]V, int, *Error) {
	s := d.s
	if s[v] != '{' {
		return nil, 0, notOpenedBy(s, v, '{', field(), want)
	}
	m := make(map[string]V)
	i := v
	for {
		key, vv, more := nextMember(s, i)
		if !more {
			return m, vv, nil
		}
		if len(m) == d.lim.MaxSensors {
			return nil, 0, validationErr(field(), fmt.Sprintf("must have at most %d entries", d.lim.MaxSensors))
		}
		if _, dup := m[key]; dup {
			return nil, 0, validationErr(joinKey(field(), key), "duplicate key")
		}
		val, end, e := value(key, vv)
		if e != nil {
			return nil, 0, e
		}
		m[key] = val
		i = end
	}
}

const nullRule = "must not be null; leave the field out instead"

// sensorValue decodes the number at s[v], returning it and the offset after
// it.
func (d *decoder) sensorValue(v int, field func() string) (float64, int, *Error) {
	s := d.s
	if c := s[v]; c != '-' && !isDigit(c) {
		rule := "must be a finite number, not " + kindName(s, v)
		switch c {
		case 'n':
			rule += " (leave a failed sensor out and report it in sensor_status instead)"
		case '{', '[':
			rule += " (sensors is a flat map of names to numbers)"
		}
		return 0, 0, validationErr(field(), rule)
	}
	end := skipValue(s, v)
	lit := s[v:end]
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil || (f == 0 && !zeroLiteral(lit)) {
		// ParseFloat overflows to ±Inf with an error, and underflows to
		// zero without one.
		return 0, 0, validationErr(field(), numberRangeRule)
	}
	if f == 0 {
		f = 0 // -0 is stored as 0
	}
	return f, end, nil
}

// zeroLiteral reports whether the JSON number lit has only zero digits in its
// mantissa.
func zeroLiteral(lit string) bool {
	for i := 0; i < len(lit); i++ {
		switch c := lit[i]; {
		case c == 'e' || c == 'E':
			return true
		case c >= '1' && c <= '9':
			return false
		}
	}
	return true
}

// int decodes the integer readings[k].<name> at s[v].
func (d *decoder) int(v, k int, name string) (int64, *Error) {
	lit, rule := d.intLiteral(v)
	if rule == "" {
		n, err := strconv.ParseInt(lit, 10, 64)
		if err == nil {
			return n, nil
		}
		rule = "is out of range for a 64-bit integer"
	}
	return 0, validationErr(joinKey(joinIndex("readings", k), name), rule)
}

// nonNegInt decodes a non-negative int64 at s[v], or returns the rule it
// breaks.
func (d *decoder) nonNegInt(v int) (int64, string) {
	n, rule := d.nonNegative(v, math.MaxInt64)
	return int64(n), rule
}

// uint decodes a non-negative uint64 at s[v], or returns the rule it breaks.
func (d *decoder) uint(v int) (uint64, string) {
	return d.nonNegative(v, math.MaxUint64)
}

// nonNegative decodes a non-negative integer of at most limit at s[v], or
// returns the rule it breaks.
func (d *decoder) nonNegative(v int, limit uint64) (uint64, string) {
	lit, rule := d.intLiteral(v)
	if rule != "" {
		return 0, rule
	}
	if lit[0] == '-' {
		return 0, "must be a non-negative integer"
	}
	n, err := strconv.ParseUint(lit, 10, 64)
	if err != nil || n > limit {
		return 0, fmt.Sprintf("is out of range: must be at most %d", limit)
	}
	return n, ""
}

// intLiteral returns the integer literal at s[v], or a rule when the value is
// not a number written as an integer.
func (d *decoder) intLiteral(v int) (string, string) {
	s := d.s
	c := s[v]
	if c != '-' && !isDigit(c) {
		if c == 'n' {
			return "", nullRule
		}
		return "", "must be an integer, not " + kindName(s, v)
	}
	end := skipValue(s, v)
	lit := s[v:end]
	if strings.ContainsAny(lit, ".eE") {
		return "", "must be an integer written without a fraction or exponent (got " + lit + ")"
	}
	return lit, ""
}

// str decodes the string at s[v].
func (d *decoder) str(v int, field string) (string, *Error) {
	if c := d.s[v]; c != '"' {
		if c == 'n' {
			return "", validationErr(field, "must be a string, not null")
		}
		return "", validationErr(field, "must be a string, not "+kindName(d.s, v))
	}
	return d.stringAt(v), nil
}

// stringAt returns the decoded value of the string starting at the quote s[v].
func (d *decoder) stringAt(v int) string {
	end, esc := skipString(d.s, v)
	raw := d.s[v+1 : end-1]
	if esc {
		return unquote(raw)
	}
	return raw
}

// nextMember advances from i, the '{' of an object or the end of its
// previous member's value, to the next member: its decoded key and the offset
// of its value. At the end of the object it returns more=false and, in v, the
// offset after the '}'.
func nextMember(s string, i int) (key string, v int, more bool) {
	i = skipWS(s, i)
	if s[i] == '{' || s[i] == ',' {
		i = skipWS(s, i+1)
	}
	if s[i] == '}' {
		return "", i + 1, false
	}
	end, esc := skipString(s, i)
	key = s[i+1 : end-1]
	if esc {
		key = unquote(key)
	}
	i = skipWS(s, end) // at ':'
	return key, skipWS(s, i+1), true
}

// nextElem advances from i, the '[' of an array or the end of its previous
// element, to the next element. At the end of the array it returns
// more=false and the offset after the ']'.
func nextElem(s string, i int) (v int, more bool) {
	i = skipWS(s, i)
	if s[i] == '[' || s[i] == ',' {
		i = skipWS(s, i+1)
	}
	if s[i] == ']' {
		return i + 1, false
	}
	return i, true
}
