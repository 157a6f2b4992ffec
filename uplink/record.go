package uplink

import (
	"sync"

	"greenhouse-gateway/buffer"
)

// deliveryGroup records deliveries in the buffer in groups: a caller that
// finds another's MarkDelivered under way queues its batches, and the
// caller committing takes everything queued meanwhile in its next
// MarkDelivered. Each MarkDelivered is a synced Badger transaction, and the
// buffer runs them one at a time; workers finishing devices together share
// one instead of waiting for each other's.
type deliveryGroup struct {
	mu      sync.Mutex
	queued  []buffer.Pending
	waiters []chan error
	leading bool
}

// record marks batches delivered and returns once they are recorded (or
// their group failed).
func (g *deliveryGroup) record(store Store, batches []buffer.Pending) error {
	done := make(chan error, 1)
	g.mu.Lock()
	g.queued = append(g.queued, batches...)
	g.waiters = append(g.waiters, done)
	if g.leading {
		g.mu.Unlock()
		return <-done
	}
	g.leading = true
	for len(g.waiters) > 0 {
		group, waiters := g.queued, g.waiters
		g.queued, g.waiters = nil, nil
		g.mu.Unlock()
		err := store.MarkDelivered(group)
		for _, w := range waiters {
			w <- err
		}
		g.mu.Lock()
	}
	g.leading = false
	g.mu.Unlock()
	return <-done
}
