package devicesim

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"greenhouse-gateway/firmware-contract"
)

// Sensor keys and sensor names as the greenhouse firmware sends them.
const (
	keyTemp     = "bme280_temp_c"
	keyHumidity = "humidity_pct"
	keyPressure = "pressure_hpa"
	keySoil     = "soil_moisture_pct"

	sensorBME280 = "bme280"
	sensorSoil   = "soil_moisture"
)

// generator is the sampling side of one device boot: it builds the boot's batches, numbering
// them from seq 0 and giving each a window that starts after the previous one ended.
// It does no I/O and reads no clock: callers pass the current time.
type generator struct {
	hardwareID     string
	bootID         string
	firmware       string
	friendlyName   string
	boot           time.Time     // wall-clock time of the boot
	step           int64         // milliseconds between two readings
	readings       int           // readings per batch
	clockSyncAfter time.Duration // time after boot before the device clock is synced

	seq       uint64
	lastEndMS int64 // device-clock end of the previous window; meaningful when seq > 0
	rng       *rand.Rand
	env       environment
}

func newGenerator(hardwareID, bootID, friendlyName string, cfg *Config, boot time.Time, rng *rand.Rand) *generator {
	step := (cfg.Interval / time.Duration(cfg.Readings)).Milliseconds()
	return &generator{
		hardwareID:     hardwareID,
		bootID:         bootID,
		firmware:       cfg.FirmwareVersion,
		friendlyName:   friendlyName,
		boot:           boot,
		step:           max(step, 1),
		readings:       cfg.Readings,
		clockSyncAfter: cfg.ClockSyncAfter,
		rng:            rng,
		env:            newEnvironment(rng),
	}
}

// registration returns the registration payload of this boot.
func (g *generator) registration() contract.Registration {
	return contract.Registration{
		HardwareID:      g.hardwareID,
		BootID:          g.bootID,
		FirmwareVersion: g.firmware,
		FriendlyName:    g.friendlyName,
		Capabilities: contract.Capabilities{
			Sensors:  []string{sensorBME280, sensorSoil},
			Features: map[string]bool{"tft_display": false, "offline_buffering": true},
		},
	}
}

// clock returns the device's clock at wall-clock time t, in epoch milliseconds, and the offset
// to subtract from such a timestamp to get the uptime. Before the clock is synced the device
// counts from 1970-01-01 at boot, so the offset is zero.
func (g *generator) clock(t time.Time) (ms, offset int64) {
	if t.Sub(g.boot) < g.clockSyncAfter {
		return t.Sub(g.boot).Milliseconds(), 0
	}
	return t.UnixMilli(), g.boot.UnixMilli()
}

// next builds the next batch at wall-clock time now. The readings are spaced step ms apart and
// end at now, unless that would overlap the previous window, in which case the window starts
// 1 ms after the previous one ended. Timestamps are therefore unique within the boot, and so
// are batch ids.
func (g *generator) next(now time.Time) contract.Batch {
	end, offset := g.clock(now)
	span := int64(g.readings-1) * g.step
	start := end - span
	if g.seq > 0 && start <= g.lastEndMS {
		start = g.lastEndMS + 1
		end = start + span
	}

	readings := make([]contract.Reading, g.readings)
	for i := range readings {
		ts := start + int64(i)*g.step
		uptime := max(ts-offset, 0)
		readings[i] = contract.Reading{
			TimestampMS:  ts,
			UptimeMS:     &uptime,
			Sensors:      g.env.sample(g.rng),
			SensorStatus: map[string]string{sensorBME280: contract.SensorOK, sensorSoil: contract.SensorOK},
		}
	}
	seq := g.seq
	b := contract.Batch{
		BatchID:         fmt.Sprintf("%s_%s_%d_%d", g.hardwareID, g.bootID, start, end),
		HardwareID:      g.hardwareID,
		BootID:          g.bootID,
		FirmwareVersion: g.firmware,
		Seq:             &seq,
		Readings:        readings,
	}
	g.seq++
	g.lastEndMS = end
	return b
}

// uptime returns the device's uptime at wall-clock time t in milliseconds.
func (g *generator) uptime(t time.Time) int64 { return max(t.Sub(g.boot).Milliseconds(), 0) }

// reboot starts a new boot at wall-clock time boot: a new boot_id, seq from 0, uptime from 0,
// and, with a clock sync delay, no NTP time again until it passes. The greenhouse and the
// random stream of sensor values go on.
func (g *generator) reboot(bootID string, boot time.Time) {
	g.bootID = bootID
	g.boot = boot
	g.seq = 0
	g.lastEndMS = 0
}

// entry returns the next batch, built at wall-clock time now, as an offline buffer entry.
func (g *generator) entry(now time.Time) *entry { return newEntry(g.next(now), g.boot) }

// entry is one batch in a device's offline buffer. Every attempt sends the same content; only
// sent_uptime_ms, which the contract defines per attempt, changes.
//
// An entry outlives the boot that built it (the offline buffer is in flash): after a reboot it
// is re-sent with its own boot_id, batch_id and seq, and its sent_uptime_ms still counts from
// its own boot, as the contract requires (uptime fields come from the batch's boot). Firmware
// does the same by keeping the previous boot's uptime at reset (RTC memory) and adding the
// current uptime; the gateway's clock anchor of that boot then stays right.
type entry struct {
	id       string
	batch    contract.Batch
	boot     time.Time // wall-clock time of the boot that built the batch
	seq      uint64
	readings int
	firstTS  int64
	lastTS   int64
	lastUp   int64 // uptime_ms of the last reading

	inflight bool      // sent and waiting for its answer
	deadline time.Time // when an inflight batch counts as unanswered
	attempts int       // times sent
}

// newEntry wraps batch b, built in the boot that started at wall-clock time boot.
func newEntry(b contract.Batch, boot time.Time) *entry {
	e := &entry{id: b.BatchID, batch: b, boot: boot, readings: len(b.Readings)}
	if b.Seq != nil {
		e.seq = *b.Seq
	}
	if n := len(b.Readings); n > 0 {
		last := b.Readings[n-1]
		e.firstTS, e.lastTS = b.Readings[0].TimestampMS, last.TimestampMS
		if last.UptimeMS != nil {
			e.lastUp = *last.UptimeMS
		}
	}
	return e
}

// uptime returns the time since the batch's own boot at wall-clock time t, in milliseconds.
func (e *entry) uptime(t time.Time) int64 { return max(t.Sub(e.boot).Milliseconds(), 0) }

// encode serialises the batch for an attempt sent at the given uptime. sent_uptime_ms is
// never before the last reading, whose window may end a few milliseconds ahead of the clock.
func (e *entry) encode(sentUptimeMS int64) ([]byte, error) {
	b := e.batch
	up := max(sentUptimeMS, e.lastUp)
	b.SentUptimeMS = &up
	payload, err := json.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("encoding batch %s: %w", b.BatchID, err)
	}
	return payload, nil
}

// environment is a greenhouse as one device's sensors see it: slowly drifting values with
// sensor noise, a soil that dries out and is watered again.
type environment struct {
	tempTarget float64 // °C, drifts between 19 and 29
	temp       float64 // °C, 18..30
	humidity   float64 // %, 30..95, falls as the temperature rises
	soil       float64 // %, dries from ~75 to 30, then watered
	pressure   float64 // hPa, 985..1040
}

func newEnvironment(rng *rand.Rand) environment {
	target := 21 + 5*rng.Float64()
	return environment{
		tempTarget: target,
		temp:       target,
		humidity:   humidityFor(target),
		soil:       40 + 30*rng.Float64(),
		pressure:   1005 + 15*rng.Float64(),
	}
}

func humidityFor(temp float64) float64 { return 95 - 1.8*temp }

// sample advances the environment by one reading and returns what the sensors measure.
func (e *environment) sample(rng *rand.Rand) map[string]float64 {
	e.tempTarget = clamp(e.tempTarget+0.05*rng.NormFloat64(), 19, 29)
	e.temp = clamp(e.temp+0.1*(e.tempTarget-e.temp)+0.1*rng.NormFloat64(), 18, 30)
	e.humidity = clamp(e.humidity+0.1*(humidityFor(e.temp)-e.humidity)+0.3*rng.NormFloat64(), 30, 95)
	e.soil -= 0.02 + 0.03*rng.Float64()
	if e.soil < 30 {
		e.soil = 65 + 10*rng.Float64()
	}
	e.pressure = clamp(e.pressure+0.01*(1013-e.pressure)+0.05*rng.NormFloat64(), 985, 1040)
	return map[string]float64{
		keyTemp:     round(e.temp, 100),
		keyHumidity: round(e.humidity, 10),
		keySoil:     round(e.soil, 10),
		keyPressure: round(e.pressure, 100),
	}
}

func clamp(v, lo, hi float64) float64 { return math.Min(math.Max(v, lo), hi) }

func round(v, scale float64) float64 { return math.Round(v*scale) / scale }
