package quality

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	contract "greenhouse-gateway/firmware-contract"
)

// Property tests: seeded random inputs, a bounded number of rounds each.
const propertyRounds = 3000

var propertyNames = []string{
	"bme280_temp_c", "ds18b20_temp_c", "humidity_pct", "soil_moisture_pct", "pressure_hpa",
	"light_lux", "co2_ppm", "battery_v", "solution_ph", "ec_ms_cm", "solar_w_m2", "rssi_dbm",
	"rain_count", "bme280", "soil_moisture",
}

var propertyStatuses = []string{"ok", "error", "degraded"}

func randomValue(rng *rand.Rand) float64 {
	switch rng.IntN(6) {
	case 0:
		return math.Round(rng.NormFloat64()*1000) / 10
	case 1:
		return rng.Float64()*2000 - 500
	case 2:
		return float64(rng.IntN(5))
	case 3:
		return rng.NormFloat64() * 1e6
	case 4:
		return []float64{0, -127, 85, 1e125, -1e125, 1e-130, 100, 5000}[rng.IntN(8)]
	default:
		return 22 + rng.NormFloat64()
	}
}

func randomReading(rng *rand.Rand) contract.Reading {
	r := contract.Reading{Sensors: map[string]float64{}, SensorStatus: map[string]string{}}
	for range rng.IntN(6) {
		r.Sensors[propertyNames[rng.IntN(len(propertyNames))]] = randomValue(rng)
	}
	for range rng.IntN(3) {
		name := []string{"bme280", "ds18b20", "soil_moisture", "soil", "co2_ppm", "light"}[rng.IntN(6)]
		r.SensorStatus[name] = propertyStatuses[rng.IntN(len(propertyStatuses))]
	}
	return r
}

func randomRecent(rng *rand.Rand, r contract.Reading) map[string][]float64 {
	recent := map[string][]float64{}
	for name, v := range r.Sensors {
		n := rng.IntN(HistoryLen + 6)
		for range n {
			switch rng.IntN(4) {
			case 0:
				recent[name] = append(recent[name], v)
			case 1:
				recent[name] = append(recent[name], v+rng.NormFloat64())
			default:
				recent[name] = append(recent[name], randomValue(rng))
			}
		}
	}
	return recent
}

func TestPropertyScoreWithinBounds(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range propertyRounds {
		r := randomReading(rng)
		recent := randomRecent(rng, r)
		q := Score(r, recent)
		require.False(t, math.IsNaN(q))
		require.GreaterOrEqual(t, q, 0.0)
		require.LessOrEqual(t, q, 1.0)
		require.Equal(t, round3(q), q, "three decimals")
		require.Equal(t, q, Score(r, recent), "deterministic")
	}
}

func TestPropertyRangeMonotone(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, u := range Units() {
		name := "x" + u.Suffix
		for range propertyRounds / 10 {
			// Two values on the same side of the range, b farther out than a.
			span := u.Max - u.Min
			a := u.Max + rng.Float64()*span
			b := a + rng.Float64()*span
			if rng.IntN(2) == 0 {
				a, b = u.Min-(a-u.Max), u.Min-(b-u.Max)
			}
			require.LessOrEqual(t, Value(name, b, nil), Value(name, a, nil), "%s: %v is farther than %v", name, b, a)
			inside := u.Min + rng.Float64()*span
			require.Equal(t, 1.0, Value(name, inside, nil), "%s: %v is inside", name, inside)
		}
	}
}

func TestPropertySpikeMonotone(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	u, _ := UnitOf("x_c")
	for range propertyRounds {
		h := make([]float64, MinSpikeHistory+rng.IntN(HistoryLen))
		for i := range h {
			h[i] = 20 + rng.NormFloat64()*rng.Float64()*3
		}
		m := median(nil, h)
		d1 := rng.Float64() * 40
		d2 := d1 + rng.Float64()*40
		s1 := math.Copysign(1, rng.Float64()-0.5)
		s2 := math.Copysign(1, rng.Float64()-0.5)
		f1, f2 := spikeFactor(u, m+s1*d1, h), spikeFactor(u, m+s2*d2, h)
		require.LessOrEqual(t, f2, f1, "farther from the median %v: %v vs %v", m, d2, d1)
		require.GreaterOrEqual(t, f2, spikeFloor)
	}
}

func TestPropertyStuckMonotone(t *testing.T) {
	for n := range HistoryLen + 3 {
		h := []float64{1}
		for range n {
			h = append(h, 50)
		}
		longer := append(append([]float64(nil), h...), 50)
		require.LessOrEqual(t, Value("x_pct", 50, longer), Value("x_pct", 50, h), "run %d", n)
	}
}

func TestPropertyErrorNeverRaises(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for range propertyRounds {
		r := randomReading(rng)
		recent := randomRecent(rng, r)
		before := Score(r, recent)
		worse := contract.Reading{Sensors: r.Sensors, SensorStatus: map[string]string{}}
		for k, v := range r.SensorStatus {
			worse.SensorStatus[k] = v
		}
		worse.SensorStatus[[]string{"bme280", "soil", "co2_ppm", "x", "humidity_pct"}[rng.IntN(5)]] = contract.SensorError
		require.LessOrEqual(t, Score(worse, recent), before, "%v -> %v", r.SensorStatus, worse.SensorStatus)
	}
}

func TestPropertySequenceEqualsFullHistory(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for range propertyRounds / 30 {
		rs := make([]contract.Reading, 1+rng.IntN(40))
		for i := range rs {
			rs[i] = randomReading(rng)
			if i > 0 && rng.IntN(3) == 0 {
				rs[i].Sensors = rs[i-1].Sensors // repeated values, for the stuck check
			}
		}
		got := ScoreSequence(rs)
		full := map[string][]float64{}
		for i, r := range rs {
			require.Equal(t, Score(r, full), got[i], "reading %d: the bounded history changes nothing", i)
			for name, v := range r.Sensors {
				full[name] = append(full[name], v)
			}
		}
	}
}
