package buffer

import (
	"time"

	"greenhouse-gateway/internal/adaptive"
)

// groupWaitSteepness shapes the sigmoid of groupWait: the wait goes from
// about 2% to 98% of its maximum between 0 and twice the half rate.
const groupWaitSteepness = 4

// groupWait is how long the committer waits for more commits after taking
// the first one of a group (and every one already queued), given the
// smoothed arrival rate of commits, per second. It follows a sigmoid of the
// rate centred on halfRate (adaptive.Fraction; there it waits about half of
// maxWait), shifted so that a rate of 0 waits exactly 0: a lone device,
// arriving when nothing else does, is not delayed, and under load the wait
// grows smoothly towards maxWait, without a threshold. The wait is
// truncated to the nanosecond. maxWait <= 0 or halfRate <= 0 turn the wait
// off.
func groupWait(rate float64, maxWait time.Duration, halfRate float64) time.Duration {
	if maxWait <= 0 || halfRate <= 0 {
		return 0
	}
	f := adaptive.Fraction(rate, halfRate, groupWaitSteepness/halfRate)
	return time.Duration(f * float64(maxWait))
}

// Sampling of the arrival rate: counts are folded into the estimate at
// most every rateSample, weighted by how long they cover against rateTau,
// so that after an idle period the estimate is that period's (low) rate.
const (
	rateSample = 50 * time.Millisecond
	rateTau    = 250 * time.Millisecond
)

// newArrivalRate returns the estimate of the rate of concurrent commit
// requests that groupWait is given. It is owned by the committer goroutine.
func newArrivalRate() adaptive.Rate {
	return adaptive.Rate{Tau: rateTau, MinInterval: rateSample}
}
