package ingest

import "greenhouse-gateway/firmware-contract"

// maxDeferredPerConn bounds the QoS 1 and 2 readings of one connection
// whose commit is under way: while that many wait, mochi reads nothing
// more from the connection (the device waits in its TCP stream, as it
// did when each message was answered before the next was read). It stays
// below receiveMaximum, so a device that only publishes readings at QoS 1
// never exhausts mochi's receive quota.
const maxDeferredPerConn = 8

// ackPipe answers one connection's deferred readings in the order they
// arrived. A message is decoded, validated and queued for the group
// commit on the connection's goroutine, in order; the wait for the commit
// and the answer (the ack-topic message, then the PUBACK or PUBREC) run
// on a goroutine of their own, each answer after the previous one. So the
// connection's next message can join the group being formed while the
// previous one's group is written and synced, and every acknowledgement
// still follows the sync of what it acknowledges.
//
// add and idle are called only from the connection's goroutine.
type ackPipe struct {
	slots chan struct{}
	// last is closed once the newest deferred message was answered (nil:
	// none yet).
	last chan struct{}
}

// add defers one message: start runs now (on the connection's goroutine)
// and returns what waits for the commit; answer then sends its result,
// once every message added before it was answered.
func (p *ackPipe) add(start func() func() (*contract.Ack, bool), answer func(*contract.Ack, bool)) {
	if p.slots == nil {
		p.slots = make(chan struct{}, maxDeferredPerConn)
	}
	p.slots <- struct{}{}
	finish := start()
	prev, done := p.last, make(chan struct{})
	p.last = done
	go func() {
		ack, ok := finish()
		if prev != nil {
			<-prev
		}
		answer(ack, ok)
		close(done)
		<-p.slots
	}()
}

// idle returns once every message added so far was answered: a message
// handled without deferral is answered after them.
func (p *ackPipe) idle() {
	if p.last != nil {
		<-p.last
	}
}
