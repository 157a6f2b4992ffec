package adaptive

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestFraction(t *testing.T) {
	tests := []struct {
		name             string
		rate             float64
		centre, steep    float64
		minWant, maxWant float64
	}{
		{"no arrivals: at once", 0, 20, 0.25, 0, 0},
		{"negative rate: at once", -3, 20, 0.25, 0, 0},
		{"NaN rate: at once", math.NaN(), 20, 0.25, 0, 0},
		{"flat sigmoid: never waits", 1000, 20, 0, 0, 0},
		{"negative steepness: never waits", 1000, 20, -1, 0, 0},
		{"one a second: almost at once", 1, 20, 0.25, 0.001, 0.003},
		{"at the centre: half", 20, 20, 0.25, 0.495, 0.505},
		{"far above the centre: all", 200, 20, 0.25, 1, 1},
		{"infinite rate: all", math.Inf(1), 20, 0.25, 1, 1},
		{"steep: below the centre near 0", 15, 20, 2, 0, 0.001},
		{"steep: above the centre near 1", 25, 20, 2, 0.999, 1},
		// The buffer's shape: steepness 4/centre.
		{"a few devices: a thousandth", 10, 2000, 4.0 / 2000, 0, 0.001},
		{"a tenth of the centre", 200, 2000, 4.0 / 2000, 0.0075, 0.01},
		{"the centre: about half", 2000, 2000, 4.0 / 2000, 0.49, 0.5},
		{"twice the centre: 98%", 4000, 2000, 4.0 / 2000, 0.98, 1},
		{"far above: all", 1e9, 2000, 4.0 / 2000, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Fraction(tt.rate, tt.centre, tt.steep)
			require.GreaterOrEqual(t, got, tt.minWant)
			require.LessOrEqual(t, got, tt.maxWant)
		})
	}
}

// TestFractionRisesWithTheRate checks both callers' shapes: the uplink's
// (centre 20, steepness 0.25) and the buffer's (steepness 4/centre).
func TestFractionRisesWithTheRate(t *testing.T) {
	shapes := []struct {
		centre, steep, step, upTo float64
	}{
		{20, 0.25, 0.5, 100},
		{1000, 4.0 / 1000, 50, 10_000},
	}
	for _, s := range shapes {
		prev := -1.0
		for rate := 0.0; rate <= s.upTo; rate += s.step {
			f := Fraction(rate, s.centre, s.steep)
			require.GreaterOrEqual(t, f, prev, "centre %v, rate %v", s.centre, rate)
			require.LessOrEqual(t, f, 1.0)
			prev = f
		}
	}
}

// TestRateHoldsShortIntervals runs the buffer's estimate of concurrent
// commits: counts folded at most every 50ms, time constant 250ms.
func TestRateHoldsShortIntervals(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	tests := []struct {
		name string
		// arrivals: at offset, n requests.
		arrivals []arrival
		min, max float64
	}{
		{"first request", []arrival{{0, 1}}, 0, 0},
		{"steady 1000/s for a second", steady(1000, time.Second), 900, 1100},
		{"steady 10/s for a second", steady(10, time.Second), 5, 15},
		{"a lone request after a second of idle follows a burst", append(steady(5000, 500*time.Millisecond),
			arrival{1500 * time.Millisecond, 1}), 0, 100},
		{"a lone request after three seconds of idle", append(steady(5000, 500*time.Millisecond),
			arrival{3500 * time.Millisecond, 1}), 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Rate{Tau: 250 * time.Millisecond, MinInterval: 50 * time.Millisecond}
			var got float64
			for _, ar := range tt.arrivals {
				got = r.Add(ar.n, t0.Add(ar.at))
			}
			require.GreaterOrEqual(t, got, tt.min)
			require.LessOrEqual(t, got, tt.max)
		})
	}
}

// arrival is n events arriving at an offset.
type arrival struct {
	at time.Duration
	n  int
}

// steady is one event every 1/rate seconds for d.
func steady(rate float64, d time.Duration) []arrival {
	var out []arrival
	step := time.Duration(float64(time.Second) / rate)
	for at := time.Duration(0); at <= d; at += step {
		out = append(out, arrival{at, 1})
	}
	return out
}

// TestRateConvergesAndDecays runs the uplink's estimates: every count
// folded, time constant 30s.
func TestRateConvergesAndDecays(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name  string
		every time.Duration
		n     int
		steps int
		want  float64
	}{
		{"10 a second for 10 time constants", 100 * time.Millisecond, 1, 3000, 10},
		{"50 every second", time.Second, 50, 300, 50},
		{"nothing counted", time.Second, 0, 100, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Rate{Tau: 30 * time.Second}
			now := t0
			for range tt.steps {
				r.Add(tt.n, now)
				now = now.Add(tt.every)
			}
			require.InDelta(t, tt.want, r.At(now.Add(-tt.every)), tt.want*0.01+1e-9)
		})
	}
	r := Rate{Tau: 30 * time.Second}
	require.Zero(t, r.At(t0), "no estimate before any count")
	r.Add(10, t0)
	r.Add(10, t0.Add(time.Second))
	got := r.At(t0.Add(time.Second))
	require.Positive(t, got)
	require.InDelta(t, got/2.718281828, r.At(t0.Add(31*time.Second)), got*0.001, "decays by e per time constant without events")
}

func TestRateSameInstant(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := Rate{Tau: 10 * time.Second}
	r.Add(0, t0)
	require.InDelta(t, 0.5, r.Add(5, t0), 1e-12, "a count at the last fold's instant adds n/Tau")
	require.InDelta(t, 0.8, r.Add(3, t0.Add(-time.Millisecond)), 1e-12, "and so does one read from the clock before it")
	require.Equal(t, 0.8, r.At(t0), "neither moves the clock")

	held := Rate{Tau: 10 * time.Second, MinInterval: time.Second}
	held.Add(0, t0)
	require.Zero(t, held.Add(5, t0), "held below MinInterval")
	require.Zero(t, held.Add(5, t0.Add(500*time.Millisecond)), "still held")
	w := 1 - math.Exp(-0.1)
	require.InDelta(t, w*10, held.Add(0, t0.Add(time.Second)), 1e-12, "folded together over the whole interval")
}
