package contract

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// benchBatch is a typical batch: 10 readings of 5 sensors and 3 statuses,
// with the optional fields.
func benchBatch() []byte {
	rs := make([]string, 10)
	for i := range rs {
		rs[i] = fmt.Sprintf(`{"timestamp_ms":%d,"uptime_ms":%d,"sensors":{"bme280_temp_c":%.1f,"bme280_humidity_pct":45.2,`+
			`"bme280_pressure_hpa":1013.25,"ds18b20_temp_c":21.75,"soil_moisture_pct":62.3},`+
			`"sensor_status":{"bme280":"ok","ds18b20":"ok","soil_moisture":"ok"}}`,
			testTS-int64(9-i)*60000, 3000000+i*60000, 20+float64(i)/10)
	}
	return []byte(`{"batch_id":"` + testBID + `","hardware_id":"` + testHW + `","boot_id":"` + testBoot +
		`","firmware_version":"1.0.16","seq":41,"sent_uptime_ms":3600000,"readings":[` + strings.Join(rs, ",") + `]}`)
}

func BenchmarkDecodeBatch(b *testing.B) {
	data := benchBatch()
	lim := DefaultLimits()
	now := time.UnixMilli(testTS + 60000)
	if _, err := DecodeBatch(data, testHW, lim, now); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeBatch(data, testHW, lim, now); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCanonical(b *testing.B) {
	batch, err := DecodeBatch(benchBatch(), testHW, DefaultLimits(), time.Time{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = batch.IdentityHash()
	}
}

// BenchmarkCanonicalIdentity is what the ingest path pays per batch for
// both the stored bytes and the identity hash (BenchmarkCanonical's
// IdentityHash plus a Canonical, before they shared one encoding).
func BenchmarkCanonicalIdentity(b *testing.B) {
	batch, err := DecodeBatch(benchBatch(), testHW, DefaultLimits(), time.Time{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		_, _ = batch.CanonicalIdentity()
	}
}

// BenchmarkCanonicalAndIdentityHash encodes twice (Canonical, then
// IdentityHash): what BenchmarkCanonicalIdentity is compared with.
func BenchmarkCanonicalAndIdentityHash(b *testing.B) {
	batch, err := DecodeBatch(benchBatch(), testHW, DefaultLimits(), time.Time{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = batch.Canonical()
		_ = batch.IdentityHash()
	}
}

func BenchmarkEncodeAck(b *testing.B) {
	ack := Ack{Type: AckTypeReadings, BatchID: testBID, Status: StatusAccepted}
	b.ReportAllocs()
	for b.Loop() {
		_ = EncodeAck(ack)
	}
}

func BenchmarkMarshalAck(b *testing.B) {
	ack := Ack{Type: AckTypeReadings, BatchID: testBID, Status: StatusAccepted}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := json.Marshal(ack); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeStored decodes the stored form of benchBatch, as the
// uplink does with every buffered batch; BenchmarkDecodeStoredJSON is the
// plain way, encoding/json into the same struct.
func BenchmarkDecodeStored(b *testing.B) {
	data := storedBenchBatch(b)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeStored(data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeStoredJSON(b *testing.B) {
	data := storedBenchBatch(b)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		var x Batch
		if err := json.Unmarshal(data, &x); err != nil {
			b.Fatal(err)
		}
	}
}

func storedBenchBatch(b *testing.B) []byte {
	bt, err := DecodeBatch(benchBatch(), testHW, DefaultLimits(), time.UnixMilli(testTS+60000))
	if err != nil {
		b.Fatal(err)
	}
	return bt.Canonical()
}
