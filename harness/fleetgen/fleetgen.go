// Package fleetgen builds the readings of simulated greenhouse devices, as the
// benchmarks send and store them.
package fleetgen

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"

	"greenhouse-gateway/firmware-contract"
)

// ReadingStep is the time between two readings of a device.
const ReadingStep = time.Second

// HardwareID returns the hardware_id of device i of a fleet; fleet keeps
// the fleets of different runs apart.
func HardwareID(fleet byte, i int) string {
	return fmt.Sprintf("02:BE:%02X:%02X:%02X:%02X", fleet, byte(i>>16), byte(i>>8), byte(i))
}

// Device builds one simulated device's batches as the greenhouse firmware
// does (devicesim's shape: four sensor values, two sensor statuses, seq and
// uptimes), with synced clocks and windows that follow each other, so that
// every batch_id is new. It is not safe for concurrent use.
type Device struct {
	hw     string
	boot   string
	bootMS int64
	seq    uint64
	nextMS int64
	rng    *rand.Rand
	temp   float64
}

// NewDevice starts a device whose first window begins at start.
func NewDevice(hw string, start time.Time, seed uint64) *Device {
	return &Device{
		hw: hw, boot: uuid.NewString(),
		bootMS: start.Add(-time.Hour).UnixMilli(), nextMS: start.UnixMilli(),
		rng: rand.New(rand.NewPCG(seed, 0x62656e6368)), temp: 20 + 5*rand.Float64(),
	}
}

// HardwareID returns the device's hardware_id.
func (d *Device) HardwareID() string { return d.hw }

// Next returns the next batch of n readings, encoded as the device sends it.
func (d *Device) Next(n int) (batchID string, payload []byte, err error) {
	start := d.nextMS
	end := start + int64(n-1)*ReadingStep.Milliseconds()
	d.nextMS = end + ReadingStep.Milliseconds()
	readings := make([]contract.Reading, n)
	for i := range readings {
		ts := start + int64(i)*ReadingStep.Milliseconds()
		up := ts - d.bootMS
		d.temp = math.Min(math.Max(d.temp+0.1*d.rng.NormFloat64(), 18), 30)
		readings[i] = contract.Reading{
			TimestampMS: ts,
			UptimeMS:    &up,
			Sensors: map[string]float64{
				"bme280_temp_c":     math.Round(d.temp*100) / 100,
				"humidity_pct":      math.Round((95-1.8*d.temp+d.rng.NormFloat64())*10) / 10,
				"pressure_hpa":      math.Round((1013+2*d.rng.NormFloat64())*100) / 100,
				"soil_moisture_pct": math.Round((50+10*d.rng.Float64())*10) / 10,
			},
			SensorStatus: map[string]string{"bme280": contract.SensorOK, "soil_moisture": contract.SensorOK},
		}
	}
	seq := d.seq
	d.seq++
	sent := end - d.bootMS
	b := contract.Batch{
		BatchID:         fmt.Sprintf("%s_%s_%d_%d", d.hw, d.boot, start, end),
		HardwareID:      d.hw,
		BootID:          d.boot,
		FirmwareVersion: "1.0.16",
		Seq:             &seq,
		SentUptimeMS:    &sent,
		Readings:        readings,
	}
	payload, err = json.Marshal(b)
	if err != nil {
		return "", nil, fmt.Errorf("encoding batch %s: %w", b.BatchID, err)
	}
	return b.BatchID, payload, nil
}
