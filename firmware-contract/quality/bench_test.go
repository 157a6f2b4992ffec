package quality

import (
	"fmt"
	"testing"

	contract "greenhouse-gateway/firmware-contract"
)

// benchReadings is a typical batch's readings: 10 of 5 sensors and 3
// statuses, the values drifting as a greenhouse's do.
func benchReadings() []contract.Reading {
	rs := make([]contract.Reading, 10)
	for i := range rs {
		rs[i] = contract.Reading{
			TimestampMS: 1_760_000_000_000 + int64(i)*60_000,
			Sensors: map[string]float64{"bme280_temp_c": 20 + float64(i)/10, "bme280_humidity_pct": 45.2,
				"bme280_pressure_hpa": 1013.25, "ds18b20_temp_c": 21.75, "soil_moisture_pct": 62.3 - float64(i%3)},
			SensorStatus: map[string]string{"bme280": "ok", "ds18b20": "ok", "soil_moisture": "ok"},
		}
	}
	return rs
}

// BenchmarkScoreSequence scores one batch as the uplink does for every
// batch it forwards.
func BenchmarkScoreSequence(b *testing.B) {
	rs := benchReadings()
	b.ReportAllocs()
	var sink float64
	for b.Loop() {
		sink += ScoreSequence(rs)[9]
	}
	_ = fmt.Sprint(sink)
}
