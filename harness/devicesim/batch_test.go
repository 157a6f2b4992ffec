package devicesim

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
)

var testBoot = time.Date(2025, 3, 1, 6, 0, 0, 0, time.UTC)

func TestGeneratorBatches(t *testing.T) {
	cfg := testConfig()
	cfg.Interval = 5 * time.Second
	cfg.Readings = 5
	g := newTestGenerator(&cfg, testBoot)

	seen := map[int64]bool{}
	ids := map[string]bool{}
	var prevEnd int64
	for i := range 50 {
		now := testBoot.Add(time.Duration(i+1) * cfg.Interval)
		b := g.next(now)

		require.Equal(t, "02:00:00:00:00:01", b.HardwareID)
		require.Equal(t, "7c9e6679-7425-40de-944b-e07fc1f90ae7", b.BootID)
		require.Equal(t, cfg.FirmwareVersion, b.FirmwareVersion)
		require.NotNil(t, b.Seq)
		require.Equal(t, uint64(i), *b.Seq, "seq counts from 0 per boot")
		require.Len(t, b.Readings, cfg.Readings)

		first, last := b.Readings[0].TimestampMS, b.Readings[len(b.Readings)-1].TimestampMS
		require.Equal(t, fmt.Sprintf("%s_%s_%d_%d", b.HardwareID, b.BootID, first, last), b.BatchID)
		require.Equal(t, now.UnixMilli(), last, "the window ends at the batch time")
		require.Equal(t, int64(1000), b.Readings[1].TimestampMS-first, "readings spread over the interval")
		require.Greater(t, first, prevEnd, "windows do not overlap")
		prevEnd = last
		require.False(t, ids[b.BatchID], "batch ids are unique")
		ids[b.BatchID] = true

		for _, r := range b.Readings {
			require.False(t, seen[r.TimestampMS], "timestamps are unique")
			seen[r.TimestampMS] = true
			require.NotNil(t, r.UptimeMS)
			require.Equal(t, r.TimestampMS-testBoot.UnixMilli(), *r.UptimeMS)
			require.Equal(t, map[string]string{"bme280": "ok", "soil_moisture": "ok"}, r.SensorStatus)
			require.InDelta(t, 24, r.Sensors["bme280_temp_c"], 6.0)
			require.InDelta(t, 62.5, r.Sensors["humidity_pct"], 32.5)
			require.InDelta(t, 50, r.Sensors["soil_moisture_pct"], 25.0)
			require.InDelta(t, 1012.5, r.Sensors["pressure_hpa"], 27.5)
		}
	}
}

// TestGeneratorBatchesAreValid checks the batches against the contract's own decoder.
func TestGeneratorBatchesAreValid(t *testing.T) {
	for _, readings := range []int{1, 5, 100} {
		t.Run(fmt.Sprint(readings), func(t *testing.T) {
			cfg := testConfig()
			cfg.Readings = readings
			cfg.Interval = time.Minute
			g := newGenerator("02:00:00:00:00:0A", uuid.NewString(), "sim-10", &cfg, testBoot, rand.New(rand.NewPCG(7, 7)))
			for i := range 3 {
				now := testBoot.Add(time.Duration(i+1) * cfg.Interval)
				e := g.entry(now)
				payload, err := e.encode(g.uptime(now))
				require.NoError(t, err)
				got, err := contract.DecodeBatch(payload, "02:00:00:00:00:0A", contract.Limits{}, now)
				require.NoError(t, err)
				require.Equal(t, e.id, got.BatchID)
				require.Equal(t, (now.Sub(testBoot)).Milliseconds(), *got.SentUptimeMS)
			}
		})
	}
}

func TestGeneratorSameSeedSameValues(t *testing.T) {
	cfg := testConfig()
	a := newGenerator("02:00:00:00:00:01", uuid.NewString(), "a", &cfg, testBoot, rand.New(rand.NewPCG(9, 0)))
	b := newGenerator("02:00:00:00:00:01", uuid.NewString(), "b", &cfg, testBoot, rand.New(rand.NewPCG(9, 0)))
	c := newGenerator("02:00:00:00:00:01", uuid.NewString(), "c", &cfg, testBoot, rand.New(rand.NewPCG(10, 0)))
	now := testBoot.Add(cfg.Interval)
	ba, bb, bc := a.next(now), b.next(now), c.next(now)
	for i := range ba.Readings {
		require.Equal(t, ba.Readings[i].Sensors, bb.Readings[i].Sensors)
	}
	require.NotEqual(t, ba.Readings[0].Sensors, bc.Readings[0].Sensors)
}

func TestGeneratorWindowsNeverOverlap(t *testing.T) {
	// Batches built faster than the interval (a late ticker catching up, a test calling
	// next back to back) still get distinct, increasing timestamps.
	cfg := testConfig()
	cfg.Interval = 10 * time.Second
	cfg.Readings = 4
	g := newTestGenerator(&cfg, testBoot)
	now := testBoot.Add(time.Minute)
	var last int64
	for i := range 5 {
		b := g.next(now.Add(time.Duration(i) * time.Millisecond))
		require.Greater(t, b.Readings[0].TimestampMS, last)
		for j := 1; j < len(b.Readings); j++ {
			require.Greater(t, b.Readings[j].TimestampMS, b.Readings[j-1].TimestampMS)
		}
		last = b.Readings[len(b.Readings)-1].TimestampMS
	}
}

func TestGeneratorUnsyncedClock(t *testing.T) {
	cfg := testConfig()
	cfg.Interval = 10 * time.Second
	cfg.Readings = 2
	cfg.ClockSyncAfter = 15 * time.Second
	g := newTestGenerator(&cfg, testBoot)

	b := g.next(testBoot.Add(10 * time.Second))
	require.Equal(t, int64(5000), b.Readings[0].TimestampMS, "before NTP, the clock counts from 1970 at boot")
	require.Equal(t, int64(10000), b.Readings[1].TimestampMS)
	require.Equal(t, int64(5000), *b.Readings[0].UptimeMS)
	require.Less(t, b.Readings[1].TimestampMS, contract.MinTimestampMS)
	require.True(t, strings.HasSuffix(b.BatchID, "_5000_10000"), b.BatchID)

	b = g.next(testBoot.Add(20 * time.Second))
	require.Equal(t, testBoot.Add(20*time.Second).UnixMilli(), b.Readings[1].TimestampMS, "synced after ClockSyncAfter")
	require.Equal(t, int64(20000), *b.Readings[1].UptimeMS)
	require.Equal(t, uint64(1), *b.Seq)

	// The contract's decoder takes an unsynced batch with uptimes and asks for a repair.
	g = newTestGenerator(&cfg, testBoot)
	e := g.entry(testBoot.Add(10 * time.Second))
	payload, err := e.encode(10_000)
	require.NoError(t, err)
	_, err = contract.DecodeBatch(payload, "", contract.Limits{}, testBoot.Add(10*time.Second))
	require.NoError(t, err)
}

func TestEntryEncodeKeepsContent(t *testing.T) {
	cfg := testConfig()
	g := newTestGenerator(&cfg, testBoot)
	e := g.entry(testBoot.Add(cfg.Interval))
	require.Equal(t, 5, e.readings)
	require.Equal(t, uint64(0), e.seq)

	first, err := e.encode(1000)
	require.NoError(t, err)
	second, err := e.encode(60_000)
	require.NoError(t, err)

	var a, b map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(first, &a))
	require.NoError(t, json.Unmarshal(second, &b))
	require.JSONEq(t, "1000", string(a["sent_uptime_ms"]), "never before the last reading")
	require.JSONEq(t, "60000", string(b["sent_uptime_ms"]), "sent_uptime_ms is per attempt")
	delete(a, "sent_uptime_ms")
	delete(b, "sent_uptime_ms")
	require.Equal(t, a, b, "the rest of the batch is the same on every attempt")

	early, err := e.encode(0)
	require.NoError(t, err)
	var c map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(early, &c))
	require.JSONEq(t, "1000", string(c["sent_uptime_ms"]), "sent_uptime_ms is not before the last reading")
}

func TestRegistrationPayload(t *testing.T) {
	cfg := testConfig()
	g := newTestGenerator(&cfg, testBoot)
	payload, err := json.Marshal(g.registration())
	require.NoError(t, err)
	require.JSONEq(t, `{"hardware_id":"02:00:00:00:00:01","boot_id":"7c9e6679-7425-40de-944b-e07fc1f90ae7",
		"firmware_version":"1.0.16","friendly_name":"sim-01",
		"capabilities":{"sensors":["bme280","soil_moisture"],
		                "features":{"tft_display":false,"offline_buffering":true}}}`, string(payload))
}
