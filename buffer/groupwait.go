package buffer

import (
	"math"
	"time"
)

// groupWaitSteepness shapes the sigmoid of groupWait: the wait goes from
// about 2% to 98% of its maximum between 0 and twice the half rate.
const groupWaitSteepness = 4

// groupWait is how long the committer waits for more commits after taking
// the first one of a group (and every one already queued), given the
// smoothed arrival rate of commits, per second. It follows a sigmoid of the
// rate centred on halfRate (where it waits half of maxWait), shifted so that
// a rate of 0 waits exactly 0: a lone device, arriving when nothing else
// does, is not delayed, and under load the wait grows smoothly towards
// maxWait, without a threshold. maxWait <= 0 or halfRate <= 0 turn the wait
// off.
func groupWait(rate float64, maxWait time.Duration, halfRate float64) time.Duration {
	if maxWait <= 0 || halfRate <= 0 || !(rate > 0) {
		return 0
	}
	k := groupWaitSteepness / halfRate
	s0 := 1 / (1 + math.Exp(k*halfRate))
	s := 1 / (1 + math.Exp(-k*(rate-halfRate)))
	f := (s - s0) / (1 - s0)
	w := time.Duration(f * float64(maxWait))
	return min(max(w, 0), maxWait)
}

// Sampling of the arrival rate: counts are folded into the estimate at
// most every rateSample, weighted by how long they cover against rateTau,
// so that after an idle period the estimate is that period's (low) rate.
const (
	rateSample = 50 * time.Millisecond
	rateTau    = 250 * time.Millisecond
)

// arrivalRate estimates the rate of commit requests. It is owned by the
// committer goroutine.
type arrivalRate struct {
	rate  float64 // requests per second, smoothed
	count int     // requests since last
	last  time.Time
}

// observe counts n requests arriving at now and returns the estimate.
func (a *arrivalRate) observe(now time.Time, n int) float64 {
	if a.last.IsZero() {
		a.last = now
	}
	a.count += n
	elapsed := now.Sub(a.last)
	if elapsed < rateSample {
		return a.rate
	}
	sample := float64(a.count) / elapsed.Seconds()
	w := 1 - math.Exp(-float64(elapsed)/float64(rateTau))
	a.rate += w * (sample - a.rate)
	a.count = 0
	a.last = now
	return a.rate
}
