package uplink

import (
	"container/list"
	"context"
	"math"
	"sync"
	"time"

	"greenhouse-gateway/internal/tablewrite"
)

// aimd limits the DynamoDB requests in flight: the limit grows by one for
// every limit successes (additive increase) and halves at a throttling
// answer (multiplicative decrease). One burst of throttled requests
// halves it once: only a request that started after the last decrease can
// decrease it again.
//
// Successes that report their round trip (the DynamoDB target's requests)
// also steer it by queueing, as TCP Vegas does: a request's round trip
// against the least one seen for its operation (the floor) tells how many
// requests of the limit waited in a queue instead of being served,
// limit × (1 − floor/rtt). The limit grows only while fewer than
// alpha(limit) are queued, and shrinks by one per limit successes while
// more than beta(limit) are. A service that gets slower with every
// request added (DynamoDB Local sharing the gateway's cores, an uplink
// whose bandwidth is full) is kept just past the point where more
// requests stop adding throughput; against one whose round trips stay
// flat (DynamoDB across a network) the limit grows to its maximum as
// before. Floors are kept per window (floorWindow) and the least of the
// current and the previous window counts, so a path that became slower
// for good (a fail-over link) is learnt within two windows.
type aimd struct {
	mu       sync.Mutex
	limit    float64
	min, max float64
	inflight int
	gen      uint64 // bumped at each decrease
	// waiters are the acquires waiting for a slot, first come first
	// served: a freed slot is handed to one of them, not raced for by all
	// (a bulk write has up to max_concurrency senders waiting on a limit
	// that may sit far below it).
	waiters list.List // of *slotWaiter
	changed func(limit int)
	floors  map[string]*rttFloor
	now     func() time.Time
}

// floorWindow is how long a round-trip floor is kept before it may rise.
const floorWindow = time.Minute

// rttFloor is an operation's least round trip over the current and the
// previous floorWindow.
type rttFloor struct {
	start     time.Time
	cur, prev time.Duration
}

// observe adds a round trip and returns the floor.
func (f *rttFloor) observe(now time.Time, rtt time.Duration) time.Duration {
	if now.Sub(f.start) >= floorWindow {
		f.prev, f.cur, f.start = f.cur, 0, now
	}
	if f.cur == 0 || rtt < f.cur {
		f.cur = rtt
	}
	if f.prev != 0 && f.prev < f.cur {
		return f.prev
	}
	return f.cur
}

// vegasAlpha and vegasBeta bound the requests the limit lets queue at the
// service: it grows below alpha and shrinks above beta. Like the Vegas
// limit of Netflix's concurrency-limits, they grow with log10 of the limit,
// so that a large limit tolerates the jitter of a long path.
func vegasAlpha(limit float64) float64 { return 3 * max(1, math.Log10(limit)) }
func vegasBeta(limit float64) float64  { return 6 * max(1, math.Log10(limit)) }

func newAIMD(start, maxLimit int, changed func(int)) *aimd {
	a := &aimd{limit: float64(start), min: 1, max: float64(maxLimit), changed: changed,
		floors: map[string]*rttFloor{}, now: time.Now}
	a.changed(start)
	return a
}

// slotWaiter is an acquire waiting for a slot; granted is closed once the
// slot is its own, started in generation gen.
type slotWaiter struct {
	granted chan struct{}
	gen     uint64
}

// acquire waits for a slot and returns the generation to hand to release.
func (a *aimd) acquire(ctx context.Context) (uint64, error) {
	a.mu.Lock()
	if a.inflight < int(a.limit) && a.waiters.Len() == 0 {
		a.inflight++
		gen := a.gen
		a.mu.Unlock()
		return gen, nil
	}
	w := &slotWaiter{granted: make(chan struct{})}
	el := a.waiters.PushBack(w)
	a.mu.Unlock()
	select {
	case <-w.granted:
		return w.gen, nil
	case <-ctx.Done():
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	select {
	case <-w.granted: // granted meanwhile: give the slot back
		a.inflight--
		a.grant()
	default:
		a.waiters.Remove(el)
	}
	return 0, ctx.Err()
}

// grant hands the free slots to the waiters in order. a.mu is held.
func (a *aimd) grant() {
	for a.inflight < int(a.limit) && a.waiters.Len() > 0 {
		w := a.waiters.Remove(a.waiters.Front()).(*slotWaiter)
		a.inflight++
		w.gen = a.gen
		close(w.granted)
	}
}

type outcome int

const (
	outcomeOther     outcome = iota // neither success nor throttling: no change
	outcomeSuccess                  // additive increase
	outcomeThrottled                // multiplicative decrease
)

// release frees a slot and adapts the limit to the request's outcome. op
// and rtt, when rtt is not zero, are the operation and round trip of a
// request whose latency may steer the limit (see aimd).
func (a *aimd) release(gen uint64, o outcome, op string, rtt time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.inflight--
	before := int(a.limit)
	switch o {
	case outcomeSuccess:
		switch q := a.queued(op, rtt); {
		case q > vegasBeta(a.limit):
			a.limit = max(a.min, a.limit-1/a.limit)
		case q < vegasAlpha(a.limit):
			a.limit = min(a.max, a.limit+1/a.limit)
		}
	case outcomeThrottled:
		if gen == a.gen {
			a.limit = max(a.min, float64(int(a.limit/2)))
			a.gen++
		}
	}
	if after := int(a.limit); after != before {
		a.changed(after)
	}
	a.grant()
}

// queued is how many of the limit's requests a round trip of op says
// waited at the service; 0 without a round trip.
func (a *aimd) queued(op string, rtt time.Duration) float64 {
	if rtt <= 0 {
		return 0
	}
	now := a.now()
	f := a.floors[op]
	if f == nil {
		f = &rttFloor{start: now}
		a.floors[op] = f
	}
	floor := f.observe(now, rtt)
	return a.limit * (1 - float64(floor)/float64(rtt))
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
