// Package adaptive holds the two parts of an adaptive wait, shared by the
// buffer's group commit (how long the committer waits for more commits)
// and the uplink's rounds (how long a round waits for more batches): a
// sigmoid of an arrival rate that says how much of a maximum wait to wait,
// and an estimate of that rate from counts observed at irregular times.
//
// It imports nothing of the project.
package adaptive

import (
	"math"
	"time"
)

// Fraction is the share of a maximum wait to wait at an arrival rate of
// rate events per second: a logistic sigmoid of the rate centred on
// centre, rising with the given steepness (per event per second), shifted
// and scaled so that it is exactly 0 at rate 0 (a lone arrival goes at
// once) and tends to 1 at high rates (waits fill up the group). The result
// lies in [0, 1]: 0 for a rate that is not positive (or NaN) and for a
// steepness that is not positive, 1 for an infinite rate. Callers scale it
// to their maximum wait.
func Fraction(rate, centre, steepness float64) float64 {
	if !(rate > 0) || !(steepness > 0) {
		return 0
	}
	if math.IsInf(rate, 1) {
		return 1
	}
	floor := sigmoid(-centre * steepness)
	frac := (sigmoid((rate-centre)*steepness) - floor) / (1 - floor)
	return min(1, max(0, frac))
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// Rate estimates an event rate, per second, from counts observed at
// irregular times: an exponentially weighted moving average with time
// constant Tau, where a count of n over an interval dt moves the estimate
// towards n/dt by 1-exp(-dt/Tau).
//
// Counts observed less than MinInterval after the last fold are held and
// folded with the next ones, so that a burst of short intervals does not
// swing the estimate. With MinInterval 0 every count is folded when it
// arrives; a count at the instant of the last fold, or before it (two
// goroutines reading the clock and then adding out of order), adds n/Tau,
// which is what a fold tends to as dt shrinks to 0. The first count only
// starts the clock: it is held and folded with the next interval's.
//
// A Rate is not safe for concurrent use; the zero value needs Tau set.
type Rate struct {
	Tau         time.Duration
	MinInterval time.Duration

	rate    float64   // the estimate as of last
	held    int       // counts not folded yet
	last    time.Time // the last fold
	started bool
}

// Add counts n events at now and returns the estimate as of the last fold
// (not decayed to now: see At).
func (r *Rate) Add(n int, now time.Time) float64 {
	r.held += n
	if !r.started {
		r.started, r.last = true, now
		return r.rate
	}
	dt := now.Sub(r.last)
	switch {
	case r.MinInterval > 0 && dt < r.MinInterval:
		// Too short an interval to measure: keep counting.
	case dt <= 0:
		r.rate += float64(r.held) / r.Tau.Seconds()
		r.held = 0
	default:
		w := 1 - math.Exp(-dt.Seconds()/r.Tau.Seconds())
		r.rate += w * (float64(r.held)/dt.Seconds() - r.rate)
		r.held, r.last = 0, now
	}
	return r.rate
}

// At returns the estimate at now, decayed for the time since the last
// fold as if no events arrived meanwhile: a rate that stopped reads as
// falling, not as frozen at its last value. It is 0 before any count.
func (r *Rate) At(now time.Time) float64 {
	if !r.started {
		return 0
	}
	idle := now.Sub(r.last)
	if idle <= 0 {
		return r.rate
	}
	return r.rate * math.Exp(-idle.Seconds()/r.Tau.Seconds())
}
