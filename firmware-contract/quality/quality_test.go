package quality

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	contract "greenhouse-gateway/firmware-contract"
)

func TestUnitOf(t *testing.T) {
	for _, tc := range []struct {
		name, suffix string
		known        bool
	}{
		{"bme280_temp_c", "_c", true},
		{"humidity_pct", "_pct", true},
		{"bme280_pressure_hpa", "_hpa", true},
		{"light_lux", "_lux", true},
		{"co2_ppm", "_ppm", true},
		{"battery_v", "_v", true},
		{"solution_ph", "_ph", true},
		{"ec_ms_cm", "_ms_cm", true}, // the longest suffix wins
		{"solar_w_m2", "_w_m2", true},
		{"rssi_dbm", "_dbm", true},
		{"_c", "_c", true},
		{"temp_abc", "", false}, // ends with "c" but not with "_c"
		{"rain_count", "", false},
		{"c", "", false},
		{"", "", false},
	} {
		u, ok := UnitOf(tc.name)
		require.Equal(t, tc.known, ok, tc.name)
		require.Equal(t, tc.suffix, u.Suffix, tc.name)
	}
}

// TestUnitOfIsTheLongestSuffix checks UnitOf against the definition, the
// longest suffix of Units that a name ends with, over names made of unit
// suffixes and other pieces; UnitOf relies on every suffix starting with
// '_'.
func TestUnitOfIsTheLongestSuffix(t *testing.T) {
	longest := func(name string) (Unit, bool) {
		best := -1
		for i, u := range Units() {
			if strings.HasSuffix(name, u.Suffix) && (best < 0 || len(u.Suffix) > len(Units()[best].Suffix)) {
				best = i
			}
		}
		if best < 0 {
			return Unit{}, false
		}
		return Units()[best], true
	}
	pieces := []string{"", "_", "c", "m", "ms", "cm", "w", "m2", "x", "bme280", "temp", "2"}
	for _, u := range Units() {
		require.True(t, strings.HasPrefix(u.Suffix, "_"), u.Suffix)
		pieces = append(pieces, u.Suffix, strings.TrimPrefix(u.Suffix, "_"))
	}
	r := rand.New(rand.NewPCG(5, 6))
	for range 20000 {
		var name string
		for range r.IntN(5) {
			name += pieces[r.IntN(len(pieces))]
		}
		want, wantOK := longest(name)
		got, ok := UnitOf(name)
		require.Equal(t, wantOK, ok, name)
		require.Equal(t, want.Suffix, got.Suffix, name)
	}
}

func TestUnitsAreConsistent(t *testing.T) {
	seen := map[string]bool{}
	for _, u := range Units() {
		require.False(t, seen[u.Suffix], "suffix %s once", u.Suffix)
		seen[u.Suffix] = true
		require.Regexp(t, `^_[a-z0-9_]+$`, u.Suffix)
		require.NotEmpty(t, u.Name)
		require.Less(t, u.Min, u.Max, u.Suffix)
		require.GreaterOrEqual(t, u.LowMargin, 0.0, u.Suffix)
		require.GreaterOrEqual(t, u.HighMargin, 0.0, u.Suffix)
		require.GreaterOrEqual(t, u.SpikeSpread, 0.0, u.Suffix)
	}
}

func TestRange(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    float64
		want float64
	}{
		{"t_c", 22.5, 1},
		{"t_c", -20, 1},
		{"t_c", 60, 1},
		{"t_c", 72.5, 0.5},    // 12.5 over, margin 25
		{"t_c", 85, 0},        // DS18B20 power-on value
		{"t_c", -30, 0.5},     // 10 under, margin 20
		{"t_c", -127, 0},      // DS18B20 disconnected
		{"h_pct", 100.5, 0.9}, // margin 5
		{"h_pct", -2.5, 0.5},
		{"h_pct", 200, 0},
		{"p_hpa", 1150, 0.5},
		{"l_lux", -0.001, 0}, // low margin 0: any negative value
		{"l_lux", 0, 1},
		{"l_lux", 200000, 0},
		{"c_ppm", 75, 0.5},
		{"c_ppm", 0, 0},
		{"b_v", 22.5, 0.5},
		{"s_ph", 12, 0.5},
		{"e_ms_cm", 15, 0.5},
		{"r_w_m2", 1700, 0.5},
		{"w_dbm", 0.5, 0},
		{"w_dbm", -125, 0.75},
		{"count", -1e300, 1}, // unknown unit: not judged
		{"t_c", math.NaN(), 0},
		{"t_c", math.Inf(1), 0},
		{"count", math.Inf(-1), 0}, // not finite: 0 even for an unknown unit
	} {
		require.InDelta(t, tc.want, Value(tc.name, tc.v, nil), 1e-12, "%s = %v", tc.name, tc.v)
	}
}

func TestStatus(t *testing.T) {
	temp := map[string]float64{"bme280_temp_c": 22}
	for _, tc := range []struct {
		desc    string
		sensors map[string]float64
		status  map[string]string
		want    float64
	}{
		{"no status: no claim", temp, nil, 1},
		{"ok", temp, map[string]string{"bme280": "ok"}, 1},
		{"error governs the value", temp, map[string]string{"bme280": "error"}, 0},
		{"unknown status halves", temp, map[string]string{"bme280": "degraded"}, 0.5},
		{"exact name", temp, map[string]string{"bme280_temp_c": "error"}, 0},
		{"error without value adds an entry", temp, map[string]string{"soil": "error"}, 0.5},
		{"ok without value adds none", temp, map[string]string{"soil": "ok"}, 1},
		{"unknown status without value adds 0.5", temp, map[string]string{"soil": "degraded"}, 0.75},
		{"longest governing name wins", temp, map[string]string{"bme280": "error", "bme280_temp": "ok"}, 1},
		{"longest governing name wins, other way", temp, map[string]string{"bme280": "ok", "bme280_temp": "error"}, 0},
		{"prefix needs an underscore", temp, map[string]string{"bme28": "error"}, 0.5},
		{"only failed sensors", nil, map[string]string{"a": "error", "b": "error"}, 0},
		{"empty", nil, nil, 1},
	} {
		got := Score(contract.Reading{Sensors: tc.sensors, SensorStatus: tc.status}, nil)
		require.Equal(t, tc.want, got, tc.desc)
	}
}

func TestSpike(t *testing.T) {
	steady := []float64{22.0, 22.1, 22.2, 22.1, 22.0}
	for _, tc := range []struct {
		desc   string
		v      float64
		recent []float64
		want   float64
	}{
		{"no history", 40, nil, 1},
		{"three values are too few", 40, steady[:3], 1},
		{"four are enough", 40, steady[:4], spikeFloor},
		{"z = 6 exactly: no penalty", 25.1, steady, 1},          // |25.1-22.1|/0.5
		{"z = 12: half way", 28.1, steady, 1 - 0.8*6/12},        // 0.6
		{"z = 18 exactly: the floor", 31.1, steady, spikeFloor}, // 9/0.5
		{"downward too", 19.1, steady, 1},
		{"non-finite history is skipped", 40, []float64{math.NaN(), 22, math.Inf(1), 22.1, 22.2}, 1}, // 3 finite values
		{"off for light", 100000, []float64{0, 0, 0, 0, 0}, 1},
	} {
		name := "air_temp_c"
		if tc.desc == "off for light" {
			name = "light_lux"
		}
		require.InDelta(t, tc.want, Value(name, tc.v, tc.recent), 1e-9, tc.desc)
	}
}

func TestSpikeScaleFromMAD(t *testing.T) {
	// Median 50, |x-50| = 0,10,10,20,20 -> MAD 10, scale 14.826; z = 6
	// exactly at 50 + 88.956, which is out of range, so check the factor alone.
	h := []float64{50, 40, 60, 30, 70}
	u, _ := UnitOf("x_pct")
	require.Equal(t, 1.0, spikeFactor(u, 50+6*14.826, h))
	require.InDelta(t, 0.6, spikeFactor(u, 50+12*14.826, h), 1e-9)
}

func TestStuck(t *testing.T) {
	run := func(v float64, n int) []float64 {
		out := []float64{v + 1}
		for range n {
			out = append(out, v)
		}
		return out
	}
	require.Equal(t, 1.0, Value("h_pct", 50, run(50, StuckRun-1)))
	require.Equal(t, stuckPenalty, Value("h_pct", 50, run(50, StuckRun)))
	require.Equal(t, stuckPenalty, Value("h_pct", 50, run(50, HistoryLen+5)))
	require.Equal(t, 1.0, Value("h_pct", 50.1, run(50, HistoryLen)), "a new value ends the run")
	require.Equal(t, 1.0, Value("b_v", 3.3, run(3.3, HistoryLen)), "no stuck check for volts")
	require.Equal(t, 1.0, Value("l_lux", 0, run(0, HistoryLen)), "nor for light")
	require.Equal(t, 1.0, Value("count", 0, run(0, HistoryLen)), "nor for unknown units")
	// A run broken in the middle counts only its newest part.
	h := append(run(50, 5), 49)
	h = append(h, run(50, 5)[1:]...)
	require.Equal(t, 1.0, Value("h_pct", 50, h))
}

func TestScoreIsTheRoundedMean(t *testing.T) {
	r := contract.Reading{Sensors: map[string]float64{"a_c": 22, "b_c": 22, "c_c": 70}} // 1, 1, 0.6
	require.Equal(t, 0.867, Score(r, nil))
	r.Sensors["c_c"] = 60 + 25.0/3 // 1 - (25/3)/25 = 2/3 -> (2 + 2/3)/3 = 0.8888...
	require.Equal(t, 0.889, Score(r, nil))
}

func TestScoreDoesNotModifyItsInputs(t *testing.T) {
	recent := map[string][]float64{"t_c": {25, 21, 23, 22, 24}}
	r := contract.Reading{Sensors: map[string]float64{"t_c": 40}, SensorStatus: map[string]string{"t": "ok"}}
	Score(r, recent)
	require.Equal(t, []float64{25, 21, 23, 22, 24}, recent["t_c"])
	require.Equal(t, map[string]float64{"t_c": 40}, r.Sensors)
}
