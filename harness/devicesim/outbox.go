package devicesim

import "time"

// outbox is a device's offline buffer: batches in the order they were built, bounded to a
// capacity, the oldest dropped first when a new batch does not fit. It is owned by one
// goroutine and not safe for concurrent use.
type outbox struct {
	capacity int
	entries  []*entry // oldest first
	inflight int      // entries with inflight set
}

func newOutbox(capacity int) *outbox {
	return &outbox{capacity: capacity, entries: make([]*entry, 0, min(capacity, 1024))}
}

// push appends e and returns the batch dropped to make room for it, if any.
func (o *outbox) push(e *entry) (dropped *entry) {
	if len(o.entries) >= o.capacity {
		dropped = o.entries[0]
		o.entries[0] = nil
		o.entries = o.entries[1:]
		if dropped.inflight {
			o.inflight--
		}
	}
	o.entries = append(o.entries, e)
	return dropped
}

// len returns the number of batches in the buffer, sent or not.
func (o *outbox) len() int { return len(o.entries) }

// get returns the batch with the given id, or nil.
func (o *outbox) get(id string) *entry {
	for _, e := range o.entries {
		if e.id == id {
			return e
		}
	}
	return nil
}

// remove deletes the batch with the given id and reports whether it was there.
func (o *outbox) remove(id string) bool {
	for i, e := range o.entries {
		if e.id == id {
			if e.inflight {
				o.inflight--
			}
			copy(o.entries[i:], o.entries[i+1:])
			o.entries[len(o.entries)-1] = nil
			o.entries = o.entries[:len(o.entries)-1]
			return true
		}
	}
	return false
}

// nextUnsent returns the oldest batch that is not in flight, or nil.
func (o *outbox) nextUnsent() *entry {
	for _, e := range o.entries {
		if !e.inflight {
			return e
		}
	}
	return nil
}

// markInflight records that e was sent and counts as unanswered after deadline.
func (o *outbox) markInflight(e *entry, deadline time.Time) {
	if !e.inflight {
		o.inflight++
	}
	e.inflight = true
	e.deadline = deadline
}

// release puts e back among the batches waiting to be sent.
func (o *outbox) release(e *entry) {
	if e.inflight {
		o.inflight--
	}
	e.inflight = false
	e.deadline = time.Time{}
}

// releaseAll puts every inflight batch back, as after a lost connection, and returns how many.
func (o *outbox) releaseAll() int {
	n := 0
	for _, e := range o.entries {
		if e.inflight {
			o.release(e)
			n++
		}
	}
	return n
}

// expired releases the inflight batches whose deadline is not after now and returns them.
func (o *outbox) expired(now time.Time) []*entry {
	var out []*entry
	for _, e := range o.entries {
		if e.inflight && !now.Before(e.deadline) {
			o.release(e)
			out = append(out, e)
		}
	}
	return out
}

// earliestDeadline returns the first deadline among inflight batches.
func (o *outbox) earliestDeadline() (time.Time, bool) {
	var first time.Time
	found := false
	for _, e := range o.entries {
		if e.inflight && (!found || e.deadline.Before(first)) {
			first, found = e.deadline, true
		}
	}
	return first, found
}
