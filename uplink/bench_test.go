package uplink_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/tablewrite"
	"greenhouse-gateway/uplink"
)

// BenchmarkBatchItems turns a typical buffered batch (10 readings of 5
// sensors and 3 statuses) into its table items, as the uplink does for
// every batch it forwards: decoding, quality scores, identity hash, items,
// the readings encoded or as attribute maps.
func BenchmarkBatchItems(b *testing.B) {
	const hw, boot, id = "02:00:00:00:00:01", "6f1c1e9e-3b6a-4f43-9b7e-0d9d1c2b3a40", "02:00:00:00:00:01_6f1c1e9e_41"
	now := time.Now()
	rs := make([]string, 10)
	for i := range rs {
		rs[i] = fmt.Sprintf(`{"timestamp_ms":%d,"uptime_ms":%d,"sensors":{"bme280_temp_c":%.1f,"bme280_humidity_pct":45.2,`+
			`"bme280_pressure_hpa":1013.25,"ds18b20_temp_c":21.75,"soil_moisture_pct":62.3},`+
			`"sensor_status":{"bme280":"ok","ds18b20":"ok","soil_moisture":"ok"}}`,
			now.Add(-time.Duration(10-i)*time.Minute).UnixMilli(), 3000000+i*60000, 20+float64(i)/10)
	}
	raw := `{"batch_id":"` + id + `","hardware_id":"` + hw + `","boot_id":"` + boot +
		`","firmware_version":"1.0.16","seq":41,"sent_uptime_ms":3600000,"readings":[` + strings.Join(rs, ",") + `]}`
	batch, err := contract.DecodeBatch([]byte(raw), hw, contract.DefaultLimits(), now)
	if err != nil {
		b.Fatal(err)
	}
	p := buffer.Pending{Seq: 1, BatchID: id, HardwareID: hw, ReceivedAt: now, Payload: batch.Canonical()}
	// The bulk writer encodes the readings (batch mode); transactions take
	// them as attribute maps.
	for _, way := range []struct {
		name  string
		items func(*tablewrite.Items) int
	}{
		{"encoded", func(it *tablewrite.Items) int { return len(it.Encode()) }},
		{"maps", func(it *tablewrite.Items) int { return len(it.ReadingItems()) }},
	} {
		b.Run(way.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				it, err := uplink.BatchItems(p, 30*24*time.Hour, now)
				if err != nil {
					b.Fatal(err)
				}
				if n := way.items(it); n != 10 {
					b.Fatalf("%d reading items", n)
				}
			}
		})
	}
}
