package uplink

import (
	"container/heap"
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// completions is a min-heap of simulated request completions.
type completions []simRequest

type simRequest struct {
	issued, done time.Time
	gen          uint64
}

func (c completions) Len() int           { return len(c) }
func (c completions) Less(i, j int) bool { return c[i].done.Before(c[j].done) }
func (c completions) Swap(i, j int)      { c[i], c[j] = c[j], c[i] }
func (c *completions) Push(x any)        { *c = append(*c, x.(simRequest)) }
func (c *completions) Pop() any {
	old := *c
	x := old[len(old)-1]
	*c = old[:len(old)-1]
	return x
}

// sim drives an aimd with closed-loop requests against a simulated
// service, on a clock of its own. The service runs servers requests at
// once (0: any number), each taking service(), and queues the rest in
// order.
type sim struct {
	a       *aimd
	servers int
	service func() time.Duration
	clock   time.Time
	running completions
	queue   []simRequest
}

func newSim(a *aimd, servers int, service func() time.Duration) *sim {
	s := &sim{a: a, servers: servers, service: service, clock: time.Unix(0, 0)}
	a.now = func() time.Time { return s.clock }
	return s
}

func (s *sim) start(r simRequest) {
	r.done = s.clock.Add(s.service())
	heap.Push(&s.running, r)
}

// run lets n requests complete and returns the limit after each.
func (s *sim) run(t *testing.T, n int) []int {
	t.Helper()
	var limits []int
	for range n {
		for s.a.inflight < s.a.current() {
			gen, err := s.a.acquire(context.Background())
			require.NoError(t, err)
			r := simRequest{issued: s.clock, gen: gen}
			if s.servers == 0 || s.running.Len() < s.servers {
				s.start(r)
			} else {
				s.queue = append(s.queue, r)
			}
		}
		r := heap.Pop(&s.running).(simRequest)
		s.clock = r.done
		s.a.release(r.gen, outcomeSuccess, "BatchWriteItem", r.done.Sub(r.issued))
		if len(s.queue) > 0 {
			s.start(s.queue[0])
			s.queue = s.queue[1:]
		}
		limits = append(limits, s.a.current())
	}
	return limits
}

// TestAIMDStopsWhereQueueingStarts: against a service that serves two
// requests at a time (DynamoDB Local on a 2-core machine), the limit
// settles a few requests above two, where more requests only wait, and
// never below what keeps both servers busy.
func TestAIMDStopsWhereQueueingStarts(t *testing.T) {
	s := newSim(newAIMD(16, 64, func(int) {}), 2, func() time.Duration { return 4 * time.Millisecond })
	limits := s.run(t, 20000)
	settled := limits[len(limits)/2:]
	lo, hi := settled[0], settled[0]
	for _, l := range settled {
		lo, hi = min(lo, l), max(hi, l)
	}
	t.Logf("limit settled between %d and %d", lo, hi)
	require.GreaterOrEqual(t, lo, 3, "both servers stay busy")
	require.LessOrEqual(t, hi, 2+9, "at most beta requests wait")
}

// TestAIMDGrowsWhereRoundTripsStayFlat: against a service whose round
// trips do not grow with the requests in flight (DynamoDB across a
// network, 20 ms with 10% jitter), the limit grows to its maximum as
// without round trips; and when the path becomes slower for good (60 ms),
// it is back at the maximum within two floor windows.
func TestAIMDGrowsWhereRoundTripsStayFlat(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	base := 20 * time.Millisecond
	s := newSim(newAIMD(16, 64, func(int) {}), 0, func() time.Duration {
		return base + time.Duration(rng.Int64N(int64(base/10)))
	})
	limits := s.run(t, 20000)
	require.Equal(t, 64, limits[len(limits)-1])

	base = 60 * time.Millisecond
	changed := s.clock
	lowest := 64
	var back time.Duration
	for back == 0 && s.clock.Sub(changed) < 4*floorWindow {
		limits = s.run(t, 2000)
		lowest = min(lowest, slices.Min(limits))
		if limits[len(limits)-1] == 64 && lowest < 64 {
			back = s.clock.Sub(changed)
		}
	}
	t.Logf("the limit fell to %d and was back at the maximum %s after the path became slower", lowest, back)
	require.NotZero(t, back)
	require.LessOrEqual(t, back, 2*floorWindow+10*time.Second)
}

// TestAIMDHandsFreedSlotsToWaitersInOrder: a freed slot goes to the
// longest waiting acquire alone; an acquire whose context ends leaves the
// queue without a slot.
func TestAIMDHandsFreedSlotsToWaitersInOrder(t *testing.T) {
	a := newAIMD(2, 2, func(int) {})
	ctx := context.Background()
	held := make([]uint64, 2)
	for i := range held {
		g, err := a.acquire(ctx)
		require.NoError(t, err)
		held[i] = g
	}
	state := func() (inflight, waiting int) {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.inflight, a.waiters.Len()
	}
	type result struct {
		i   int
		err error
	}
	results := make(chan result, 3)
	ctxs := make([]context.Context, 3)
	cancels := make([]context.CancelFunc, 3)
	for i := range 3 {
		ctxs[i], cancels[i] = context.WithCancel(ctx)
		defer cancels[i]()
		go func() {
			_, err := a.acquire(ctxs[i])
			results <- result{i, err}
		}()
		require.Eventually(t, func() bool { _, w := state(); return w == i+1 }, 5*time.Second, time.Millisecond)
	}

	a.release(held[0], outcomeOther, "", 0)
	r := <-results
	require.Equal(t, result{0, nil}, r, "the first waiter got the slot")
	inflight, waiting := state()
	require.Equal(t, 2, inflight)
	require.Equal(t, 2, waiting, "the others still wait")

	cancels[1]()
	r = <-results
	require.Equal(t, 1, r.i)
	require.ErrorIs(t, r.err, context.Canceled)
	inflight, waiting = state()
	require.Equal(t, 2, inflight, "a cancelled wait takes no slot")
	require.Equal(t, 1, waiting)

	a.release(held[1], outcomeOther, "", 0)
	require.Equal(t, result{2, nil}, <-results)
	inflight, waiting = state()
	require.Equal(t, 2, inflight)
	require.Zero(t, waiting)
}

// TestAIMDLeaksNoSlots races acquires whose contexts end at random
// against releases: every slot taken is given back, granted or not.
func TestAIMDLeaksNoSlots(t *testing.T) {
	a := newAIMD(3, 3, func(int) {})
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for range 200 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(200))*time.Microsecond)
				gen, err := a.acquire(ctx)
				cancel()
				if err == nil {
					time.Sleep(time.Duration(rng.IntN(50)) * time.Microsecond)
					a.release(gen, outcomeOther, "", 0)
				}
			}
		})
	}
	wg.Wait()
	a.mu.Lock()
	defer a.mu.Unlock()
	require.Zero(t, a.inflight)
	require.Zero(t, a.waiters.Len())
}
