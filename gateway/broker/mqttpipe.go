package broker

import (
	"sync"
	"sync/atomic"

	"greenhouse-gateway/firmware-contract"
)

// maxDeferredPerConn bounds the QoS 1 and 2 messages of one connection
// not answered yet: while that many wait, mochi reads nothing more from
// the connection (the device waits in its TCP stream, as it did when each
// message was answered before the next was read). It stays below
// receiveMaximum, so a device that only publishes readings at QoS 1 never
// exhausts mochi's receive quota.
const maxDeferredPerConn = 8

// maxDeferred bounds the deferred messages of all connections together: a
// full group commit's worth (buffer.max_group_batches' default). More
// would not make the groups larger, only hold more decoded batches in
// memory; beyond it, a connection is read once a deferred message is
// answered.
const maxDeferred = 1024

// ackPipe answers one connection's deferred messages in the order they
// arrived. A message is decoded, validated and queued for the group
// commit on the connection's goroutine, in order; one of the broker's
// answerers waits for the commit, finishes the ingest call (the registry,
// the audit trail, the metrics) and queues the answer (the ack-topic
// message, then the PUBACK or PUBREC) on the client's outbound queue,
// which the client's own writer sends. So the connection's next message
// can join the group being formed while the previous one's group is
// written and synced; every acknowledgement follows the sync of what it
// acknowledges; and an answerer never waits for a client's socket (a
// client that does not read is disconnected once its outbound queue is
// full: mochi's AckDeferred).
//
// add and idle are called only from the connection's goroutine.
type ackPipe struct {
	// slots holds one value per message added and not yet answered.
	slots chan struct{}
	// queue is the answerer's queue of the connection (nil: none yet).
	queue chan pipeItem
}

type pipeItem struct {
	finish func() (*contract.Ack, bool)
	send   func(*contract.Ack, bool)
	slots  chan struct{}
}

// add defers one message, once it has a slot of the connection's and one
// of all of a's: start runs now (on the connection's goroutine) and
// returns what waits for the commit; send then queues its answer, after
// every message added before it was answered. Once a is stopped, add
// answers on the caller's goroutine.
func (p *ackPipe) add(a *answerers, start func() func() (*contract.Ack, bool), send func(*contract.Ack, bool)) {
	if p.slots == nil {
		p.slots = make(chan struct{}, maxDeferredPerConn)
	}
	p.slots <- struct{}{}
	a.slots <- struct{}{}
	it := pipeItem{finish: start(), send: send, slots: p.slots}
	a.mu.RLock()
	if a.stopped {
		a.mu.RUnlock()
		a.answer(it)
		return
	}
	if p.queue == nil {
		p.queue = a.queues[a.next.Add(1)%uint32(len(a.queues))]
	}
	p.queue <- it // never blocks: a queue holds as many as a has slots
	a.mu.RUnlock()
}

// idle returns once every message added so far was answered: a message
// handled without deferral is answered after them.
func (p *ackPipe) idle() {
	if p.slots == nil {
		return
	}
	for range cap(p.slots) {
		p.slots <- struct{}{}
	}
	for range cap(p.slots) {
		<-p.slots
	}
}

// answerers are the goroutines that wait for deferred messages' commits
// and answer them, a few for all connections (a goroutine per message or
// per connection would grow a new stack for its answers again and again).
// A connection's messages all go to one answerer's queue; commits complete
// in the order they were queued, so a message never waits behind a later
// one, and answers never wait for a client.
type answerers struct {
	queues []chan pipeItem
	next   atomic.Uint32
	// slots holds one value per deferred message not yet answered, at most
	// maxDeferred.
	slots chan struct{}

	mu      sync.RWMutex
	stopped bool
	wg      sync.WaitGroup
}

func newAnswerers(n int) *answerers {
	a := &answerers{queues: make([]chan pipeItem, n), slots: make(chan struct{}, maxDeferred)}
	for i := range a.queues {
		a.queues[i] = make(chan pipeItem, maxDeferred)
	}
	return a
}

// start runs the answerers until stop.
func (a *answerers) start() {
	for _, q := range a.queues {
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			for it := range q {
				a.answer(it)
			}
		}()
	}
}

// answer waits for one message's commit and answers it.
func (a *answerers) answer(it pipeItem) {
	ack, ok := it.finish()
	it.send(ack, ok)
	<-a.slots
	<-it.slots
}

// stop answers what is queued and ends the answerers; a message deferred
// later is answered on the connection's goroutine.
func (a *answerers) stop() {
	a.mu.Lock()
	if a.stopped {
		a.mu.Unlock()
		return
	}
	a.stopped = true
	for _, q := range a.queues {
		close(q)
	}
	a.mu.Unlock()
	a.wg.Wait()
}
