package contract

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const (
	testHW   = "AA:BB:CC:DD:EE:FF"
	testBoot = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
	testBID  = testHW + "_" + testBoot + "_1704067200000_1704067800000"
	testTS   = int64(1704067800000)
)

var testNow = time.UnixMilli(1704067900000)

// batchJSON writes a batch payload. Members given in top replace or add to
// the defaults (a value of "-" removes the member); members are written in
// the default order, then the added ones in the order given.
func batchJSON(top ...string) string {
	return object([]string{
		"batch_id", q(testBID),
		"hardware_id", q(testHW),
		"boot_id", q(testBoot),
		"firmware_version", q("1.0.16"),
		"readings", "[" + readingJSON() + "]",
	}, top)
}

// readingJSON writes a reading, as batchJSON does a batch.
func readingJSON(members ...string) string {
	return object([]string{
		"timestamp_ms", fmt.Sprint(testTS),
		"sensors", `{"bme280_temp_c":22.5,"humidity_pct":45.2}`,
		"sensor_status", `{"bme280":"ok"}`,
	}, members)
}

func object(defaults, overrides []string) string {
	type kv struct{ k, v string }
	var members []kv
	for i := 0; i < len(defaults); i += 2 {
		members = append(members, kv{defaults[i], defaults[i+1]})
	}
outer:
	for i := 0; i < len(overrides); i += 2 {
		for j := range members {
			if members[j].k == overrides[i] {
				members[j].v = overrides[i+1]
				continue outer
			}
		}
		members = append(members, kv{overrides[i], overrides[i+1]})
	}
	var parts []string
	for _, m := range members {
		if m.v != "-" {
			parts = append(parts, q(m.k)+":"+m.v)
		}
	}
	return "{" + strings.Join(parts, ",") + "}"
}

func q(s string) string {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func readingsJSON(rs ...string) string { return "[" + strings.Join(rs, ",") + "]" }

func TestDecodeBatchRejects(t *testing.T) {
	tests := []struct {
		name     string
		payload  string
		sender   string
		lim      Limits
		now      time.Time
		reason   Reason // validation_error when empty
		field    string
		contains string
	}{
		// Syntax: always reported with the byte offset, before any other rule.
		{name: "empty", payload: "", contains: "byte offset 0: empty payload"},
		{name: "whitespace only", payload: " \n", contains: "byte offset 2: no JSON value"},
		{name: "truncated", payload: `{"batch_id":"x`, contains: "byte offset 14: unexpected end of input"},
		{name: "truncated literal", payload: `{"a":tru`, contains: "byte offset 8: unexpected end of input"},
		{name: "bad literal", payload: `{"a":tree}`, contains: `byte offset 5: expected a JSON value, found "t"`},
		{name: "missing colon", payload: `{"a" 1}`, contains: `byte offset 5: expected ':'`},
		{name: "missing comma", payload: `{"a":1 "b":2}`, contains: `byte offset 7: expected ',' or '}'`},
		{name: "unquoted key", payload: `{a:1}`, contains: "byte offset 1: expected a string for an object key"},
		{name: "trailing comma in array", payload: `{"a":[1,]}`, contains: "byte offset 8: trailing comma before ']'"},
		{name: "plus sign", payload: `{"a":+1}`, contains: "byte offset 5: invalid number"},
		{name: "leading dot", payload: `{"a":.5}`, contains: "byte offset 5: invalid number"},
		{name: "trailing dot", payload: `{"a":1.}`, contains: "byte offset 7: invalid number: expected a digit after '.'"},
		{name: "empty exponent", payload: `{"a":1e}`, contains: "byte offset 7: invalid number: expected a digit in the exponent"},
		{name: "leading zero", payload: `{"a":-01}`, contains: "byte offset 5: invalid number: leading zeros"},
		{name: "NaN", payload: `{"a":NaN}`, contains: "byte offset 5: NaN is not valid JSON"},
		{name: "Infinity", payload: `{"a":Infinity}`, contains: "byte offset 5: Infinity is not valid JSON"},
		{name: "minus Infinity", payload: `{"a":-Infinity}`, contains: "byte offset 5: -Infinity is not valid JSON"},
		{name: "bad escape", payload: `{"a":"\x"}`, contains: `byte offset 6: invalid escape sequence \"x"`},
		{name: "short unicode escape", payload: `{"a":"\u12"}`, contains: `byte offset 6: invalid \u escape`},
		{name: "lone low surrogate", payload: `{"a":"\udc00"}`, contains: "byte offset 6: invalid \\u escape: unpaired UTF-16 surrogate"},
		{name: "high surrogate then letter", payload: `{"a":"\ud83dx"}`, contains: "unpaired UTF-16 surrogate"},
		{name: "two high surrogates", payload: `{"a":"\ud83d\ud83d"}`, contains: "unpaired UTF-16 surrogate"},
		{name: "invalid UTF-8", payload: "{\"a\":\"\xc3\x28\"}", contains: "byte offset 6: invalid UTF-8"},
		{name: "overlong UTF-8", payload: "{\"a\":\"\xc0\xaf\"}", contains: "byte offset 6: invalid UTF-8"},
		{name: "UTF-8 encoded surrogate", payload: "{\"a\":\"\xed\xa0\x80\"}", contains: "byte offset 6: invalid UTF-8"},
		{name: "raw tab in string", payload: "{\"a\":\"\t\"}", contains: "control character U+0009"},
		{name: "non-ASCII outside strings", payload: "{\"a\":1}\xff", contains: "byte offset 7: unexpected data after the JSON value"},
		{name: "too deep", payload: strings.Repeat("[", 17) + strings.Repeat("]", 17), contains: "byte offset 16: nesting deeper than 16 levels"},
		{name: "syntax error after a semantic one", payload: `{"location":1,"batch_id":}`, contains: "byte offset 25: expected a JSON value"},

		// Shape.
		{name: "array", payload: "[]", contains: "must be a JSON object, not an array"},
		{name: "string", payload: `"x"`, contains: "must be a JSON object, not a string"},
		{name: "null", payload: "null", contains: "must be a JSON object, not null"},
		{name: "duplicate top-level key", payload: strings.Replace(batchJSON(), `"boot_id"`, `"hardware_id":"AA:BB:CC:DD:EE:FF","boot_id"`, 1), field: "hardware_id", contains: "duplicate key"},
		{name: "unknown field", payload: batchJSON("extra", "1"), field: "extra", contains: "unknown field"},
		{name: "unknown field with odd name", payload: batchJSON("a.b", "1"), field: `["a.b"]`, contains: "unknown field"},
		{name: "missing hardware_id", payload: batchJSON("hardware_id", "-"), field: "hardware_id", contains: "is required"},

		// hardware_id.
		{name: "hardware_id lower case", payload: batchJSON("hardware_id", q("aa:bb:cc:dd:ee:ff")), field: "hardware_id", contains: "must be upper case"},
		{name: "hardware_id mixed case", payload: batchJSON("hardware_id", q("AA:bb:CC:DD:EE:FF")), field: "hardware_id", contains: "must be upper case"},
		{name: "hardware_id too short", payload: batchJSON("hardware_id", q("AA:BB:CC:DD:EE")), field: "hardware_id", contains: "must be a MAC address"},
		{name: "hardware_id non-hex", payload: batchJSON("hardware_id", q("AA:BB:CC:DD:EE:FG")), field: "hardware_id", contains: "must be a MAC address"},
		{name: "hardware_id not the sender", payload: batchJSON(), sender: "11:22:33:44:55:66", field: "hardware_id", contains: `must be the sender's hardware_id "11:22:33:44:55:66"`},
		{name: "hardware_id null", payload: batchJSON("hardware_id", "null"), field: "hardware_id", contains: "must be a string, not null"},

		// boot_id.
		{name: "boot_id version 3", payload: batchJSON("boot_id", q("7c9e6679-7425-30de-944b-e07fc1f90ae7")), field: "boot_id", contains: "version digit"},
		{name: "boot_id variant 0", payload: batchJSON("boot_id", q("7c9e6679-7425-40de-044b-e07fc1f90ae7")), field: "boot_id", contains: "variant"},
		{name: "boot_id non-hex", payload: batchJSON("boot_id", q("7c9e6679-7425-40de-944b-e07fc1f90aeg")), field: "boot_id", contains: "must be a UUID v4"},
		{name: "boot_id urn", payload: batchJSON("boot_id", q("urn:uuid:"+testBoot)), field: "boot_id", contains: "must be a UUID v4"},

		// batch_id.
		{name: "batch_id prefix of another device", payload: batchJSON("batch_id", q("AA:BB:CC:DD:EE:FE_1")), field: "batch_id", contains: "must start with the hardware_id"},
		{name: "batch_id prefix without underscore", payload: batchJSON("batch_id", q(testHW+"-1")), field: "batch_id", contains: "must start with the hardware_id"},
		{name: "batch_id non-ASCII", payload: batchJSON("batch_id", q(testHW+"_é")), field: "batch_id", contains: `has 'é' at byte 18`},
		{name: "batch_id number", payload: batchJSON("batch_id", "5"), field: "batch_id", contains: "must be a string, not a number"},

		// firmware_version.
		{name: "firmware_version DEL", payload: batchJSON("firmware_version", q("1.0\x7f")), field: "firmware_version", contains: "printable ASCII"},
		{name: "firmware_version object", payload: batchJSON("firmware_version", `{"major":1}`), field: "firmware_version", contains: "must be a string, not an object"},

		// readings.
		{name: "readings over a custom limit", payload: batchJSON("readings", readingsJSON(readingJSON(), readingJSON("timestamp_ms", "1704067800001"), readingJSON("timestamp_ms", "1704067800002"))),
			lim: Limits{MaxReadings: 2}, field: "readings", contains: "must contain at most 2 readings"},
		{name: "reading array", payload: batchJSON("readings", "[[]]"), field: "readings[0]", contains: "a reading must be an object, not an array"},
		{name: "reading unknown field", payload: batchJSON("readings", readingsJSON(readingJSON(), readingJSON("timestamp_ms", "1704067800001", "temp", "1"))), field: "readings[1].temp", contains: "unknown field"},
		{name: "reading duplicate key", payload: batchJSON("readings", "["+strings.TrimSuffix(readingJSON(), "}")+`,"sensors":{}}]`), field: "readings[0].sensors", contains: "duplicate key"},

		// timestamp_ms.
		{name: "timestamp exponent of an integer", payload: batchJSON("readings", readingsJSON(readingJSON("timestamp_ms", "17040678e5"))), field: "readings[0].timestamp_ms", contains: "without a fraction or exponent (got 17040678e5)"},
		{name: "timestamp negative exponent", payload: batchJSON("readings", readingsJSON(readingJSON("timestamp_ms", "1704067800000e-0"))), field: "readings[0].timestamp_ms", contains: "without a fraction or exponent"},
		{name: "timestamp null", payload: batchJSON("readings", readingsJSON(readingJSON("timestamp_ms", "null"))), field: "readings[0].timestamp_ms", contains: "must not be null"},
		{name: "timestamp boolean", payload: batchJSON("readings", readingsJSON(readingJSON("timestamp_ms", "true"))), field: "readings[0].timestamp_ms", contains: "must be an integer, not a boolean"},
		{name: "timestamp int64 max", payload: batchJSON("readings", readingsJSON(readingJSON("timestamp_ms", "9223372036854775807"))), field: "readings[0].timestamp_ms", contains: "not before 2100"},
		{name: "timestamp int64 min", payload: batchJSON("readings", readingsJSON(readingJSON("timestamp_ms", "-9223372036854775808"))), reason: ReasonClockNotSynced, field: "readings[0].timestamp_ms", contains: "not synced"},
		{name: "timestamp below int64 min", payload: batchJSON("readings", readingsJSON(readingJSON("timestamp_ms", "-9223372036854775809"))), field: "readings[0].timestamp_ms", contains: "out of range"},
		{name: "timestamp one ms before 2000", payload: batchJSON("readings", readingsJSON(readingJSON("timestamp_ms", "946684799999"))), reason: ReasonClockNotSynced, field: "readings[0].timestamp_ms", contains: "946684799999 is before 2000-01-01T00:00:00Z"},
		{name: "timestamp past a custom skew", payload: batchJSON("readings", readingsJSON(readingJSON("timestamp_ms", "1704067960001"))),
			lim: Limits{MaxClockSkew: time.Minute}, now: testNow, field: "readings[0].timestamp_ms", contains: "allowed clock skew of 1m0s (1704067960000, 2024-01-01T00:12:40Z)"},
		{name: "timestamp duplicate among many", payload: batchJSON("readings", manyReadings(60, 47, 12)), field: "readings[47].timestamp_ms", contains: "duplicates readings[12].timestamp_ms"},
		{name: "uptime duplicate among many", payload: batchJSON("sent_uptime_ms", "999999", "readings", manyRepairable(60, 50, 3)), field: "readings[50].uptime_ms", contains: "duplicates readings[3].uptime_ms"},
		{name: "clock error names the first reading without uptime", payload: batchJSON("sent_uptime_ms", "10", "readings", readingsJSON(
			readingJSON("timestamp_ms", "1", "uptime_ms", "1"), readingJSON("timestamp_ms", "2"), readingJSON("timestamp_ms", "3"))),
			reason: ReasonClockNotSynced, field: "readings[1].timestamp_ms", contains: "missing: uptime_ms"},

		// sensors and sensor_status.
		{name: "sensors over a custom limit", payload: batchJSON(), lim: Limits{MaxSensors: 1}, field: "readings[0].sensors", contains: "must have at most 1 entries"},
		{name: "sensor_status over a custom limit", payload: batchJSON("readings", readingsJSON(readingJSON("sensors", "{}", "sensor_status", `{"a":"ok","b":"ok"}`))), lim: Limits{MaxSensors: 1}, field: "readings[0].sensor_status", contains: "must have at most 1 entries"},
		{name: "sensors null", payload: batchJSON("readings", readingsJSON(readingJSON("sensors", "null"))), field: "readings[0].sensors", contains: "must not be null"},
		{name: "sensors string", payload: batchJSON("readings", readingsJSON(readingJSON("sensors", `"22.5"`))), field: "readings[0].sensors", contains: "not a string"},
		{name: "sensor value array", payload: batchJSON("readings", readingsJSON(readingJSON("sensors", `{"a":[1]}`))), field: "readings[0].sensors.a", contains: "not an array (sensors is a flat map"},
		{name: "first bad sensor name in key order", payload: batchJSON("readings", readingsJSON(readingJSON("sensors", `{"zz-":1,"Bad":2,"ok":3}`))), field: "readings[0].sensors.Bad", contains: "names are lower case"},
		{name: "sensor name with escaped quote", payload: batchJSON("readings", readingsJSON(readingJSON("sensors", `{"a\"b":1}`))), field: `readings[0].sensors["a\"b"]`, contains: `has '"' at byte 1`},
		{name: "sensor value just over the limit", payload: batchJSON("readings", readingsJSON(readingJSON("sensors", `{"a":1e126}`))), field: "readings[0].sensors.a", contains: "got 1e+126"},
		{name: "sensor value just under the minimum", payload: batchJSON("readings", readingsJSON(readingJSON("sensors", `{"a":9.999999999999999e-131}`))), field: "readings[0].sensors.a", contains: "got 9.999999999999999e-131"},
		{name: "sensor value denormal", payload: batchJSON("readings", readingsJSON(readingJSON("sensors", `{"a":5e-324}`))), field: "readings[0].sensors.a", contains: "DynamoDB"},
		{name: "sensor value underflow with leading zeros", payload: batchJSON("readings", readingsJSON(readingJSON("sensors", `{"a":0.0000001e-400}`))), field: "readings[0].sensors.a", contains: "DynamoDB"},
		{name: "sensor status number", payload: batchJSON("readings", readingsJSON(readingJSON("sensor_status", `{"a":1}`))), field: "readings[0].sensor_status.a", contains: `must be "ok" or "error", not a number`},
		{name: "sensor status empty string", payload: batchJSON("readings", readingsJSON(readingJSON("sensor_status", `{"a":""}`))), field: "readings[0].sensor_status.a", contains: `got ""`},
		{name: "sensor_status array", payload: batchJSON("readings", readingsJSON(readingJSON("sensor_status", `["ok"]`))), field: "readings[0].sensor_status", contains: "not an array"},

		// seq, uptime_ms, sent_uptime_ms.
		{name: "seq minus zero", payload: batchJSON("seq", "-0"), field: "seq", contains: "must be a non-negative integer"},
		{name: "seq exponent", payload: batchJSON("seq", "1e2"), field: "seq", contains: "without a fraction or exponent"},
		{name: "uptime fraction", payload: batchJSON("readings", readingsJSON(readingJSON("uptime_ms", "1.5"))), field: "readings[0].uptime_ms", contains: "without a fraction"},
		{name: "uptime null", payload: batchJSON("readings", readingsJSON(readingJSON("uptime_ms", "null"))), field: "readings[0].uptime_ms", contains: "must not be null"},
		{name: "sent_uptime negative", payload: batchJSON("sent_uptime_ms", "-1"), field: "sent_uptime_ms", contains: "must be a non-negative integer"},
		{name: "sent_uptime null", payload: batchJSON("sent_uptime_ms", "null"), field: "sent_uptime_ms", contains: "must not be null"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := DecodeBatch([]byte(tt.payload), tt.sender, tt.lim, tt.now)
			require.Nil(t, b)
			var e *Error
			require.ErrorAs(t, err, &e)
			want := tt.reason
			if want == "" {
				want = ReasonValidation
			}
			require.Equal(t, want, e.Reason, "error: %v", err)
			require.Equal(t, tt.field, e.Field, "error: %v", err)
			require.Contains(t, e.Error(), tt.contains)
		})
	}
}

// manyReadings writes n readings one second apart, reading dup repeating the
// timestamp of reading of.
func manyReadings(n, dup, of int) string {
	rs := make([]string, n)
	for i := range rs {
		ts := testTS - int64(n-i)*1000
		if i == dup {
			ts = testTS - int64(n-of)*1000
		}
		rs[i] = readingJSON("timestamp_ms", fmt.Sprint(ts))
	}
	return readingsJSON(rs...)
}

// manyRepairable writes n readings to repair (timestamp 0), reading dup
// repeating the uptime of reading of.
func manyRepairable(n, dup, of int) string {
	rs := make([]string, n)
	for i := range rs {
		up := i * 1000
		if i == dup {
			up = of * 1000
		}
		rs[i] = readingJSON("timestamp_ms", "0", "uptime_ms", fmt.Sprint(up))
	}
	return readingsJSON(rs...)
}

func TestDecodeBatchFields(t *testing.T) {
	payload := batchJSON("seq", "7", "sent_uptime_ms", "600500", "readings", readingsJSON(
		readingJSON("uptime_ms", "600000", "sensors", `{"neg_zero":-0,"big":1.5E3,"bme280_temp_c":22.50}`),
		readingJSON("timestamp_ms", "1704067200000", "sensors", "-", "sensor_status", "-"),
	))
	b, err := DecodeBatch([]byte(payload), testHW, DefaultLimits(), testNow)
	require.NoError(t, err)
	seq, sent, up := uint64(7), int64(600500), int64(600000)
	want := &Batch{
		BatchID: testBID, HardwareID: testHW, BootID: testBoot, FirmwareVersion: "1.0.16",
		Seq: &seq, SentUptimeMS: &sent,
		Readings: []Reading{
			{TimestampMS: testTS, UptimeMS: &up, Sensors: map[string]float64{"neg_zero": 0, "big": 1500, "bme280_temp_c": 22.5}, SensorStatus: map[string]string{"bme280": "ok"}},
			{TimestampMS: 1704067200000, Sensors: map[string]float64{}, SensorStatus: map[string]string{}},
		},
	}
	require.Equal(t, want, b)
	require.False(t, math.Signbit(b.Readings[0].Sensors["neg_zero"]), "-0 is stored as 0")
	require.False(t, b.NeedsClockRepair())
}

func TestDecodeBatchZeroNowSkipsSkew(t *testing.T) {
	payload := batchJSON("readings", readingsJSON(readingJSON("timestamp_ms", "4102444799999")))
	_, err := DecodeBatch([]byte(payload), testHW, DefaultLimits(), time.Time{})
	require.NoError(t, err)
	_, err = DecodeBatch([]byte(payload), testHW, DefaultLimits(), testNow)
	require.ErrorContains(t, err, "allowed clock skew of 5m0s")
}

func TestDecodeBatchErrorCarriesBatchID(t *testing.T) {
	tests := []struct {
		name, payload, want string
	}{
		{"rejected by a value rule", batchJSON("firmware_version", q("")), testBID},
		{"rejected for an unknown field before batch_id", `{"x":1,"batch_id":"AA:BB:CC:DD:EE:FF_1"}`, "AA:BB:CC:DD:EE:FF_1"},
		{"batch_id escaped", `{"batch_id":"A\u0041","x":1}`, "AA"},
		{"invalid batch_id still echoed", batchJSON("batch_id", q("no good")), "no good"},
		{"no batch_id", batchJSON("batch_id", "-", "x", "1"), ""},
		{"batch_id not a string", batchJSON("batch_id", "5"), ""},
		{"invalid JSON", `{"batch_id":"AA",`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeBatch([]byte(tt.payload), testHW, DefaultLimits(), testNow)
			require.Error(t, err)
			require.Equal(t, tt.want, AsError(err).BatchID)
		})
	}
}

// TestDecodeBatchDeterministicError checks that the first error reported does
// not depend on the order of the members.
func TestDecodeBatchDeterministicError(t *testing.T) {
	a := `{"batch_id":"bad id","hardware_id":"aa:bb:cc:dd:ee:ff","boot_id":"x","firmware_version":"","readings":[]}`
	b := `{"readings":[],"firmware_version":"","boot_id":"x","hardware_id":"aa:bb:cc:dd:ee:ff","batch_id":"bad id"}`
	_, errA := DecodeBatch([]byte(a), "", DefaultLimits(), testNow)
	_, errB := DecodeBatch([]byte(b), "", DefaultLimits(), testNow)
	require.Error(t, errA)
	require.Equal(t, errA.Error(), errB.Error())
	require.Equal(t, "hardware_id", AsError(errA).Field)
}

func TestErrorString(t *testing.T) {
	require.Equal(t, "readings[2].sensors.temp_c: must be a finite number",
		(&Error{Reason: ReasonValidation, Field: "readings[2].sensors.temp_c", Rule: "must be a finite number"}).Error())
	require.Equal(t, "whole payload", (&Error{Rule: "whole payload"}).Error())
	require.Nil(t, AsError(nil))
	other := AsError(fmt.Errorf("plain"))
	require.Equal(t, ReasonValidation, other.Reason)
	wrapped := fmt.Errorf("ingest: %w", NewError(ReasonBufferFull, "", "buffer full"))
	require.Equal(t, ReasonBufferFull, AsError(wrapped).Reason)
	require.True(t, ReasonBufferFull.Retryable())
	require.False(t, ReasonConflict.Retryable())
}

func TestPathQuoting(t *testing.T) {
	tests := []struct{ prefix, key, want string }{
		{"", "batch_id", "batch_id"},
		{"readings[0].sensors", "temp_c", "readings[0].sensors.temp_c"},
		{"readings[0].sensors", "temp-c", `readings[0].sensors["temp-c"]`},
		{"readings[0].sensors", "", `readings[0].sensors[""]`},
		{"", "a.b", `["a.b"]`},
		{"x", "é", `x["é"]`},
		{"x", strings.Repeat("-", 100), `x["` + strings.Repeat("-", 80) + `"...]`},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, joinKey(tt.prefix, tt.key))
	}
}

func TestValidHardwareID(t *testing.T) {
	tests := []struct{ name, in, contains string }{
		{"valid", "AA:BB:CC:DD:EE:FF", ""},
		{"digits", "00:11:22:33:44:55", ""},
		{"lower case", "aa:bb:cc:dd:ee:ff", "must be upper case"},
		{"empty", "", "must be a MAC address"},
		{"dashes", "AA-BB-CC-DD-EE-FF", "must be a MAC address"},
		{"trailing newline", "AA:BB:CC:DD:EE:FF\n", "must be a MAC address"},
		{"wildcard", "+", "must be a MAC address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidHardwareID(tt.in)
			if tt.contains == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.contains)
		})
	}
}

func TestValidUUIDv4(t *testing.T) {
	tests := []struct{ name, in, contains string }{
		{"valid", testBoot, ""},
		{"upper case", strings.ToUpper(testBoot), ""},
		{"variant 9", "7c9e6679-7425-40de-944b-e07fc1f90ae7", ""},
		{"variant b", "550e8400-e29b-41d4-b716-446655440000", ""},
		{"contract example", "550e8400-e29b-41d4-a716-446655440000", ""},
		{"nil UUID", "00000000-0000-0000-0000-000000000000", "version digit"},
		{"version 7", "017f22e2-79b0-7cc3-98c4-dc0c0c07398f", "version digit"},
		{"variant c", "550e8400-e29b-41d4-c716-446655440000", "variant"},
		{"variant 7", "550e8400-e29b-41d4-7716-446655440000", "variant"},
		{"no hyphens", "550e8400e29b41d4a716446655440000", "must be a UUID v4"},
		{"hyphen misplaced", "550e840-0e29b-41d4-a716-446655440000", "must be a UUID v4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidUUIDv4(tt.in)
			if tt.contains == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.contains)
		})
	}
}
