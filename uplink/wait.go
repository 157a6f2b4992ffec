package uplink

import (
	"math"
	"sync"
	"time"

	"greenhouse-gateway/internal/adaptive"
)

// adaptiveWait is how long a round waits for more batches at an arrival
// rate of rate batches per second: maxWait scaled by a sigmoid centred on
// target with the given steepness (adaptive.Fraction), so exactly 0 at
// rate 0 (a lone batch goes at once) and tending to maxWait at high rates
// (rounds fill up to the API's item limits), rounded to the nanosecond.
// The result lies in [0, maxWait].
func adaptiveWait(rate float64, maxWait time.Duration, target, steepness float64) time.Duration {
	if maxWait <= 0 {
		return 0
	}
	return time.Duration(math.Round(adaptive.Fraction(rate, target, steepness) * float64(maxWait)))
}

// ewmaRate is an adaptive.Rate that several goroutines share: rounds,
// delivery records and the operator report.
type ewmaRate struct {
	mu   sync.Mutex
	rate adaptive.Rate
	// stopAfter, when set, makes the estimate 0 once no event was counted
	// for that long (the drain rate: a stopped drain reads 0).
	stopAfter time.Duration
	lastEvent time.Time
}

func newEWMARate(tau time.Duration) *ewmaRate {
	return &ewmaRate{rate: adaptive.Rate{Tau: tau}}
}

// add records n events at now.
func (e *ewmaRate) add(n int, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.rate.Add(n, now)
	if n > 0 && now.After(e.lastEvent) {
		e.lastEvent = now
	}
}

// at returns the estimate at now, decayed for the time without events.
func (e *ewmaRate) at(now time.Time) float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopAfter > 0 && now.Sub(e.lastEvent) >= e.stopAfter {
		return 0
	}
	return e.rate.At(now)
}
