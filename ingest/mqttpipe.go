package ingest

import (
	"sync"
	"sync/atomic"
	"time"

	"greenhouse-gateway/firmware-contract"
)

// maxDeferredPerConn bounds the QoS 1 and 2 readings of one connection
// not answered yet: while that many wait, mochi reads nothing more from
// the connection (the device waits in its TCP stream, as it did when each
// message was answered before the next was read). It stays below
// receiveMaximum, so a device that only publishes readings at QoS 1 never
// exhausts mochi's receive quota.
const maxDeferredPerConn = 8

// maxDeferred bounds the deferred readings of all connections together
// whose commit is under way: a full group commit's worth
// (buffer.max_group_batches' default). More would not make the groups
// larger, only hold more decoded batches in memory; beyond it, a
// connection is read once a deferred message's commit is answered.
const maxDeferred = 1024

// answerLinger is how long a connection's answering goroutine waits for
// more answers before it ends: under load it lives on (a new goroutine
// per answer would grow a new stack each time), and an idle device holds
// none.
const answerLinger = 2 * time.Second

// ackPipe answers one connection's deferred readings in the order they
// arrived. A message is decoded, validated and queued for the group
// commit on the connection's goroutine, in order. One of the broker's
// answerers waits for the commit and finishes the ingest call (the
// registry, the audit trail, the metrics); a goroutine of the
// connection's own then sends the answer (the ack-topic message, then the
// PUBACK or PUBREC), one message after the other. So the connection's next
// message can join the group being formed while the previous one's group
// is written and synced; every acknowledgement follows the sync of what it
// acknowledges; and a device that stops reading its socket blocks only its
// own answers (and, after maxDeferredPerConn of them, its own reads).
//
// add and idle are called only from the connection's goroutine.
type ackPipe struct {
	// slots holds one value per message added and not yet answered.
	slots chan struct{}
	// queue is the answerer's queue of the connection (nil: none yet).
	queue chan pipeItem

	mu      sync.Mutex
	ready   []answer // finished, to be sent in this order
	running bool     // a goroutine sends ready
	wake    chan struct{}
}

type pipeItem struct {
	finish func() (*contract.Ack, bool)
	send   func(*contract.Ack, bool)
	pipe   *ackPipe
}

// answer is a finished message's answer, to be sent.
type answer struct {
	ack  *contract.Ack
	ok   bool
	send func(*contract.Ack, bool)
}

// add defers one message, once it has a slot of the connection's and one
// of all of a's: start runs now (on the connection's goroutine) and
// returns what waits for the commit; send then sends its answer, after
// every message added before it was answered. Once a is stopped, add
// waits for the commit on the caller's goroutine.
func (p *ackPipe) add(a *answerers, start func() func() (*contract.Ack, bool), send func(*contract.Ack, bool)) {
	if p.slots == nil {
		p.slots = make(chan struct{}, maxDeferredPerConn)
		p.wake = make(chan struct{}, 1)
	}
	p.slots <- struct{}{}
	a.slots <- struct{}{}
	it := pipeItem{finish: start(), send: send, pipe: p}
	a.mu.RLock()
	if a.stopped {
		a.mu.RUnlock()
		a.finish(it)
		return
	}
	if p.queue == nil {
		p.queue = a.queues[a.next.Add(1)%uint32(len(a.queues))]
	}
	p.queue <- it // never blocks: a queue holds as many as a has slots
	a.mu.RUnlock()
}

// deliver queues a finished message's answer for the connection's sender.
func (p *ackPipe) deliver(x answer) {
	p.mu.Lock()
	p.ready = append(p.ready, x)
	if !p.running {
		p.running = true
		go p.sender()
	} else {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
	p.mu.Unlock()
}

// sender sends the answers delivered, in order, and ends once none came
// for answerLinger.
func (p *ackPipe) sender() {
	timer := time.NewTimer(answerLinger)
	defer timer.Stop()
	for {
		p.mu.Lock()
		if len(p.ready) == 0 {
			p.mu.Unlock()
			timer.Reset(answerLinger)
			select {
			case <-p.wake:
				continue
			case <-timer.C:
			}
			p.mu.Lock()
			if len(p.ready) == 0 {
				p.running = false
				p.mu.Unlock()
				return
			}
		}
		x := p.ready[0]
		p.ready[0] = answer{}
		p.ready = p.ready[1:]
		p.mu.Unlock()
		x.send(x.ack, x.ok)
		<-p.slots
	}
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

// answerers are the goroutines that wait for deferred readings' commits
// and finish their ingest calls, a few for all connections. A
// connection's messages all go to one answerer's queue; commits complete
// in the order they were queued, so a message never waits behind a later
// one. They do no I/O on a client's connection (ackPipe.sender does), so
// a client that does not read cannot hold them.
type answerers struct {
	queues []chan pipeItem
	next   atomic.Uint32
	// slots holds one value per deferred message not yet finished, at
	// most maxDeferred.
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
				a.finish(it)
			}
		}()
	}
}

// finish waits for one message's commit and hands its answer to its
// connection's sender.
func (a *answerers) finish(it pipeItem) {
	ack, ok := it.finish()
	<-a.slots
	it.pipe.deliver(answer{ack: ack, ok: ok, send: it.send})
}

// stop finishes what is queued and ends the answerers; a message deferred
// later is finished on the connection's goroutine.
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
