package contract

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCanonicalIgnoresSpelling(t *testing.T) {
	a := batchJSON("seq", "3", "readings", readingsJSON(readingJSON(
		"sensors", `{"humidity_pct":45.2,"bme280_temp_c":22.5,"x":1500}`,
		"sensor_status", `{"soil":"ok","bme280":"error"}`)))
	// The same batch: other key order, whitespace, escapes and number forms.
	b := "\n{ \"readings\" : [ { \"sensor_status\" : {\"bme280\":\"error\", \"soil\":\"ok\"},\r\n" +
		"\"sensors\":{\"x\":1.5e3, \"bme280_temp_c\":22.50, \"humidity\\u005fpct\":4.52E1}, \"timestamp_ms\":1704067800000 } ],\n" +
		"\t\"seq\":3, \"firmware_version\":\"1.0.16\", \"boot_id\":\"" + testBoot + "\", \"hardware_id\":\"\\u0041A:BB:CC:DD:EE:FF\", \"batch_id\":\"" + testBID + "\" }\n"
	ba, err := DecodeBatch([]byte(a), testHW, DefaultLimits(), testNow)
	require.NoError(t, err)
	bb, err := DecodeBatch([]byte(b), testHW, DefaultLimits(), testNow)
	require.NoError(t, err)
	require.Equal(t, string(ba.Canonical()), string(bb.Canonical()))
	require.Equal(t, PayloadHash(ba.Canonical()), PayloadHash(bb.Canonical()))
	require.Equal(t, ba.IdentityHash(), bb.IdentityHash())
	require.Equal(t,
		`{"batch_id":"`+testBID+`","hardware_id":"AA:BB:CC:DD:EE:FF","boot_id":"`+testBoot+`","firmware_version":"1.0.16","seq":3,`+
			`"readings":[{"timestamp_ms":1704067800000,"sensors":{"bme280_temp_c":22.5,"humidity_pct":45.2,"x":1500},"sensor_status":{"bme280":"error","soil":"ok"}}]}`,
		string(ba.Canonical()))
}

func TestIdentityHash(t *testing.T) {
	decode := func(top ...string) *Batch {
		b, err := DecodeBatch([]byte(batchJSON(top...)), testHW, DefaultLimits(), testNow)
		require.NoError(t, err)
		return b
	}
	base := decode("seq", "1", "sent_uptime_ms", "1000")
	require.Equal(t, base.IdentityHash(), decode("seq", "1", "sent_uptime_ms", "2000").IdentityHash(), "a resend with a new sent_uptime_ms is the same batch")
	require.Equal(t, base.IdentityHash(), decode("seq", "1").IdentityHash())
	require.NotEqual(t, PayloadHash(base.Canonical()), PayloadHash(decode("seq", "1", "sent_uptime_ms", "2000").Canonical()), "Canonical keeps sent_uptime_ms")
	require.NotEqual(t, base.IdentityHash(), decode("seq", "2", "sent_uptime_ms", "1000").IdentityHash())
	require.NotEqual(t, base.IdentityHash(), decode("seq", "1", "sent_uptime_ms", "1000", "firmware_version", q("1.0.17")).IdentityHash())
	require.NotEqual(t, base.IdentityHash(), decode("seq", "1", "sent_uptime_ms", "1000",
		"readings", readingsJSON(readingJSON("sensors", `{"bme280_temp_c":22.6,"humidity_pct":45.2}`))).IdentityHash())
}

// TestCanonicalMatchesEncodingJSON checks the hand-written encoder against
// encoding/json over random values in the valid range, and over the strings
// that need escaping.
func TestCanonicalMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	up := int64(12)
	seq := uint64(math.MaxUint64)
	b := &Batch{
		BatchID: testBID, HardwareID: testHW, BootID: testBoot, Seq: &seq, SentUptimeMS: &up,
		FirmwareVersion: `v1 <"esp-idf"> \ & ~` + "\x01\u2028\xff",
		Readings:        []Reading{{TimestampMS: testTS, UptimeMS: &up, SensorStatus: map[string]string{"a": "ok"}, TimeSource: TimeSourceGateway}},
	}
	for range 2000 {
		m := map[string]float64{}
		for range 8 {
			var f float64
			switch rng.IntN(4) {
			case 0:
				f = math.Float64frombits(rng.Uint64())
			case 1:
				f = float64(rng.IntN(2000)-1000) / 10
			case 2:
				f = math.Pow(10, float64(rng.IntN(250)-125)) * rng.Float64()
			default:
				f = rng.NormFloat64() * 1e21
			}
			if numberRule(f) == "" {
				m[string(rune('a'+rng.IntN(26)))+"_x"] = f
			}
		}
		b.Readings[0].Sensors = m
		want, err := json.Marshal(b)
		require.NoError(t, err)
		require.Equal(t, string(want), string(b.Canonical()))
	}
}

func TestCanonicalNilMaps(t *testing.T) {
	b := &Batch{BatchID: testBID, HardwareID: testHW, BootID: testBoot, FirmwareVersion: "1", Readings: []Reading{{TimestampMS: testTS}}}
	require.NoError(t, b.Validate(DefaultLimits(), testNow), "nil maps are valid (empty)")
	c := b.Canonical()
	require.Contains(t, string(c), `"sensors":{},"sensor_status":{}`)
	again, err := DecodeBatch(c, testHW, DefaultLimits(), testNow)
	require.NoError(t, err)
	require.Empty(t, again.Readings[0].Sensors)
}

func TestRepairClock(t *testing.T) {
	payload := batchJSON("sent_uptime_ms", "610000", "readings", readingsJSON(
		readingJSON("timestamp_ms", "0", "uptime_ms", "300000"),
		readingJSON("timestamp_ms", "0", "uptime_ms", "600000"),
		readingJSON("timestamp_ms", "1704067800000", "uptime_ms", "605000"),
	))
	decode := func() *Batch {
		b, err := DecodeBatch([]byte(payload), testHW, DefaultLimits(), testNow)
		require.NoError(t, err)
		require.True(t, b.NeedsClockRepair())
		require.NoError(t, b.Validate(DefaultLimits(), testNow), "a repairable batch is valid before repair")
		return b
	}

	t.Run("repairs from the anchor", func(t *testing.T) {
		b := decode()
		id := b.IdentityHash()
		anchor := ClockAnchor(testNow.UnixMilli(), *b.SentUptimeMS)
		b.RepairClock(anchor)
		require.False(t, b.NeedsClockRepair())
		require.NoError(t, b.Validate(DefaultLimits(), testNow))
		require.Equal(t, anchor+300000, b.Readings[0].TimestampMS)
		require.Equal(t, anchor+600000, b.Readings[1].TimestampMS)
		require.Equal(t, TimeSourceGateway, b.Readings[0].TimeSource)
		require.Equal(t, testTS, b.Readings[2].TimestampMS, "synced readings are left alone")
		require.Empty(t, b.Readings[2].TimeSource)
		require.NotEqual(t, id, b.IdentityHash(), "the identity hash is taken before repair")

		// Repaired batches carry time_source; they read back with encoding/json.
		c := b.Canonical()
		require.Contains(t, string(c), `"time_source":"gateway"`)
		var again Batch
		require.NoError(t, json.Unmarshal(c, &again))
		require.Equal(t, b, &again)
		_, err := DecodeBatch(c, testHW, DefaultLimits(), testNow)
		require.ErrorContains(t, err, "devices must not send it")
	})
	t.Run("repair that collides with a synced reading", func(t *testing.T) {
		b := decode()
		b.RepairClock(testTS - 300000) // reading 0 lands on reading 2
		err := b.Validate(DefaultLimits(), testNow)
		require.ErrorContains(t, err, "readings[2].timestamp_ms: duplicates readings[0].timestamp_ms")
		require.Equal(t, testBID, AsError(err).BatchID)
	})
	t.Run("repair into the future", func(t *testing.T) {
		b := decode()
		b.RepairClock(testNow.UnixMilli())
		require.ErrorContains(t, b.Validate(DefaultLimits(), testNow), "readings[1].timestamp_ms: 1704068500000 is later than the gateway's time")
	})
	t.Run("repair before 2000", func(t *testing.T) {
		b := decode()
		b.RepairClock(0)
		require.ErrorContains(t, b.Validate(DefaultLimits(), testNow), "as repaired by the gateway, is before 2000")
	})
	t.Run("repair overflow", func(t *testing.T) {
		b := decode()
		b.RepairClock(math.MaxInt64 - 1)
		require.Equal(t, int64(math.MaxInt64), b.Readings[0].TimestampMS)
		require.ErrorContains(t, b.Validate(DefaultLimits(), time.Time{}), "not before 2100")
	})
}

func TestValidateConstructed(t *testing.T) {
	valid := func() *Batch {
		return &Batch{BatchID: testBID, HardwareID: testHW, BootID: testBoot, FirmwareVersion: "1.0.16",
			Readings: []Reading{{TimestampMS: testTS, Sensors: map[string]float64{"a": 1}, SensorStatus: map[string]string{"a": "ok"}}}}
	}
	neg := int64(-1)
	tests := []struct {
		name     string
		mutate   func(*Batch)
		field    string
		contains string
	}{
		{"valid", func(*Batch) {}, "", ""},
		{"NaN", func(b *Batch) { b.Readings[0].Sensors["a"] = math.NaN() }, "readings[0].sensors.a", "finite number"},
		{"Inf", func(b *Batch) { b.Readings[0].Sensors["a"] = math.Inf(-1) }, "readings[0].sensors.a", "finite number"},
		{"smallest bad key", func(b *Batch) {
			b.Readings[0].Sensors = map[string]float64{"z-": 1, "b-": 2, "c": math.NaN(), "a": 1}
		}, `readings[0].sensors["b-"]`, "may only have"},
		{"time_source", func(b *Batch) { b.Readings[0].TimeSource = "device" }, "readings[0].time_source", `must be empty or "gateway"`},
		{"negative uptime", func(b *Batch) { b.Readings[0].UptimeMS = &neg }, "readings[0].uptime_ms", "non-negative"},
		{"negative sent uptime", func(b *Batch) { b.SentUptimeMS = &neg }, "sent_uptime_ms", "non-negative"},
		{"no readings", func(b *Batch) { b.Readings = nil }, "readings", "at least 1 reading"},
		{"too many readings", func(b *Batch) {
			for i := range 100 {
				b.Readings = append(b.Readings, Reading{TimestampMS: testTS - int64(i+1)})
			}
		}, "readings", "at most 100 readings"},
		{"bad status", func(b *Batch) { b.Readings[0].SensorStatus["a"] = "fine" }, "readings[0].sensor_status.a", `got "fine"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := valid()
			tt.mutate(b)
			err := b.Validate(Limits{}, testNow)
			if tt.contains == "" {
				require.NoError(t, err)
				return
			}
			require.Equal(t, tt.field, AsError(err).Field, "error: %v", err)
			require.ErrorContains(t, err, tt.contains)
		})
	}
}

// TestCheckUniqueSortedMatchesQuadratic checks that the sort-based duplicate
// search used for large batches reports what the quadratic one does.
func TestCheckUniqueSortedMatchesQuadratic(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 500 {
		n := 33 + rng.IntN(70)
		b := &Batch{Readings: make([]Reading, n)}
		for i := range b.Readings {
			r := &b.Readings[i]
			if rng.IntN(4) == 0 {
				up := int64(rng.IntN(3 * n))
				r.TimestampMS, r.UptimeMS = int64(rng.IntN(10)), &up
			} else {
				r.TimestampMS = testTS + int64(rng.IntN(5*n))
			}
		}
		got := b.checkUnique()
		// The quadratic reference.
		var want *Error
		for i := 1; i < n && want == nil; i++ {
			for j := 0; j < i; j++ {
				ri, rj := &b.Readings[i], &b.Readings[j]
				if ri.pendingRepair() == rj.pendingRepair() &&
					(ri.pendingRepair() && *ri.UptimeMS == *rj.UptimeMS || !ri.pendingRepair() && ri.TimestampMS == rj.TimestampMS) {
					want = &Error{Field: joinIndex("readings", i), Rule: joinIndex("readings", j)}
					break
				}
			}
		}
		if want == nil {
			require.Nil(t, got)
			continue
		}
		require.NotNil(t, got)
		require.True(t, strings.HasPrefix(got.Field, want.Field+"."), "got %s, want %s", got.Field, want.Field)
		require.Contains(t, got.Rule, "duplicates "+want.Rule+".")
	}
}

func TestCanonicalIdentity(t *testing.T) {
	tests := []struct {
		name string
		kv   []string
	}{
		{"seq and sent_uptime_ms", []string{"seq", "1", "sent_uptime_ms", "1000"}},
		{"sent_uptime_ms only", []string{"sent_uptime_ms", "0"}},
		{"seq only", []string{"seq", "7"}},
		{"neither", nil},
		{"escaped firmware_version", []string{"sent_uptime_ms", "5", "firmware_version", `"1.0 <beta> \"q\""`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := []byte(batchJSON(tt.kv...))
			b, err := DecodeBatch(data, testHW, DefaultLimits(), time.Time{})
			require.NoError(t, err, "%s", data)
			c, id := b.CanonicalIdentity()
			require.Equal(t, string(b.Canonical()), string(c))
			require.Equal(t, b.IdentityHash(), id)
			c2, id2 := b.CanonicalIdentity() // the pooled scratch is reused
			require.Equal(t, c, c2)
			require.Equal(t, id, id2)
			require.NotSame(t, &c[0], &c2[0], "each call returns its own bytes, not the scratch buffer")
		})
	}
}
