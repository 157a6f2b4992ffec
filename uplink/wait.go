package uplink

import (
	"math"
	"sync"
	"time"
)

// AdaptiveWait is how long a round waits for more batches at an arrival
// rate of rate batches per second: a sigmoid centred on target with the
// given steepness, shifted and scaled so that it is exactly 0 at rate 0
// (a lone batch goes at once) and tends to maxWait at high rates (rounds
// fill up to the API's item limits). The result lies in [0, maxWait].
func AdaptiveWait(rate float64, maxWait time.Duration, target, steepness float64) time.Duration {
	if maxWait <= 0 || !(rate > 0) || steepness <= 0 {
		return 0
	}
	if math.IsInf(rate, 1) {
		return maxWait
	}
	sigmoid := func(x float64) float64 { return 1 / (1 + math.Exp(-x)) }
	floor := sigmoid(-target * steepness)
	frac := (sigmoid((rate-target)*steepness) - floor) / (1 - floor)
	frac = min(1, max(0, frac))
	return time.Duration(math.Round(frac * float64(maxWait)))
}

// ewmaRate estimates an event rate (per second) from irregularly spaced
// counts, exponentially weighted with time constant tau: a count of n
// after dt moves the estimate towards n/dt by 1-exp(-dt/tau).
type ewmaRate struct {
	mu   sync.Mutex
	tau  time.Duration
	rate float64
	last time.Time
	seen bool
}

// add records n events at now.
func (e *ewmaRate) add(n int, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.seen {
		e.seen, e.last = true, now
		// No interval to measure yet: the first count only starts the clock.
		return
	}
	dt := now.Sub(e.last)
	if dt <= 0 {
		// Same instant: fold the count into the next interval.
		e.rate += float64(n) / e.tau.Seconds()
		return
	}
	alpha := 1 - math.Exp(-dt.Seconds()/e.tau.Seconds())
	e.rate += alpha * (float64(n)/dt.Seconds() - e.rate)
	e.last = now
}

// at returns the estimate at now, decayed for the time without events.
func (e *ewmaRate) at(now time.Time) float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.seen {
		return 0
	}
	idle := now.Sub(e.last)
	if idle <= 0 {
		return e.rate
	}
	return e.rate * math.Exp(-idle.Seconds()/e.tau.Seconds())
}
