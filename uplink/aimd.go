package uplink

import (
	"context"
	"sync"

	"greenhouse-gateway/internal/tablewrite"
)

// aimd limits the DynamoDB requests in flight: the limit grows by one for
// every limit successes (additive increase) and halves at a throttling
// answer (multiplicative decrease). One burst of throttled requests
// halves it once: only a request that started after the last decrease can
// decrease it again.
type aimd struct {
	mu       sync.Mutex
	limit    float64
	min, max float64
	inflight int
	gen      uint64 // bumped at each decrease
	wake     chan struct{}
	changed  func(limit int)
}

func newAIMD(start, maxLimit int, changed func(int)) *aimd {
	a := &aimd{limit: float64(start), min: 1, max: float64(maxLimit), wake: make(chan struct{}), changed: changed}
	a.changed(start)
	return a
}

// acquire waits for a slot and returns the generation to hand to release.
func (a *aimd) acquire(ctx context.Context) (uint64, error) {
	for {
		a.mu.Lock()
		if a.inflight < int(a.limit) {
			a.inflight++
			gen := a.gen
			a.mu.Unlock()
			return gen, nil
		}
		wake := a.wake
		a.mu.Unlock()
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-wake:
		}
	}
}

type outcome int

const (
	outcomeOther     outcome = iota // neither success nor throttling: no change
	outcomeSuccess                  // additive increase
	outcomeThrottled                // multiplicative decrease
)

// release frees a slot and adapts the limit to the request's outcome.
func (a *aimd) release(gen uint64, o outcome) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.inflight--
	before := int(a.limit)
	switch o {
	case outcomeSuccess:
		a.limit = min(a.max, a.limit+1/a.limit)
	case outcomeThrottled:
		if gen == a.gen {
			a.limit = max(a.min, float64(int(a.limit/2)))
			a.gen++
		}
	}
	if after := int(a.limit); after != before {
		a.changed(after)
	}
	close(a.wake)
	a.wake = make(chan struct{})
}

// current returns the limit in force.
func (a *aimd) current() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return int(a.limit)
}

// throttled reports whether err is DynamoDB asking for less load
// (tablewrite.Throttling).
func throttled(err error) bool { return tablewrite.Throttling(err) }

// ambiguous reports whether a failed write may still have been applied
// (tablewrite.Ambiguous).
func ambiguous(err error) bool { return tablewrite.Ambiguous(err) }
