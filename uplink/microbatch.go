package uplink

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/function/event"
)

// The lambda target's micro-buffer (seed 004 §5.5). A round's batches
// become ready device by device, and a device is in at most one
// invocation at a time: its ready batches (all it has in the round, or as
// many as fit) go together, in order, and the function writes them in
// that order, not attempting later ones after one that failed
// (event.BatchEvent). Its remaining batches become ready when that
// invocation is settled, so a device's later batch is never delivered
// before an earlier one. Ready batches are packed, devices in the order
// they became ready, into invocations of at most uplink.lambda.max_items
// batches and max_bytes bytes. An invocation goes as soon as it is full,
// or when nothing is in flight (nothing more can become ready), or when
// the oldest ready batch has waited the adaptive wait:
// uplink.lambda.max_wait scaled by the sigmoid of the rate at which
// batches become ready. The invocations in flight are bounded by their
// own AIMD limit.

// itemOverhead is an event item's bytes besides its batch: the id and
// the JSON around them.
const (
	itemOverhead     = 48
	envelopeOverhead = 256
)

// readyBatch is a device batch to send, with its reading span.
type readyBatch struct {
	p        buffer.Pending
	readings int
	batch    *contract.Batch
}

// readyDevice is a device with batches ready to send.
type readyDevice struct {
	hw    string
	since time.Time // when its batches became ready
}

// packDone is one invocation's outcome.
type packDone struct {
	pack    []readyBatch
	results map[string]event.ItemResult
	err     error
	since   time.Time // when its attempt began: its sending, or that of the invocation it was split from
	// answering: the function answered an empty event sent after the
	// failed invocation of one batch.
	answering bool
}

// splitPack is a half of a failed invocation, sent as it is (poison.go).
type splitPack struct {
	pack  []readyBatch
	since time.Time
}

type microBatcher struct {
	u        *Uplink
	t        *lambdaTarget
	byDevice map[string][]buffer.Pending
	sent     map[string]int // the device's first batch not sent
	queue    []readyDevice
	// readyItems and readyBytes are the queued devices' unsent batches.
	readyItems, readyBytes int
	inflight               int
	done                   chan packDone
	firstErr               error
	// splits are halves of failed invocations, sent before anything else;
	// held are a device's batches waiting for the half of a split that
	// has its earlier ones (poison.go).
	splits []splitPack
	held   map[string][]readyBatch

	marks   sync.WaitGroup
	markMu  sync.Mutex
	markErr error
}

// forward forwards a round's batches through the readings function and
// returns the first error; a device whose batch failed stops for the
// round.
func (t *lambdaTarget) forward(ctx context.Context, l lease) error {
	order, byDevice := l.devices(l.batches)
	m := &microBatcher{u: t.u, t: t, byDevice: byDevice, sent: make(map[string]int, len(order)), done: make(chan packDone),
		held: map[string][]readyBatch{}}
	now := time.Now()
	for _, hw := range order {
		m.enqueue(hw, now)
	}
	for len(m.queue) > 0 || len(m.splits) > 0 || m.inflight > 0 {
		if ctx.Err() != nil {
			m.queue, m.readyItems, m.readyBytes = nil, 0, 0
			m.splits = nil
			clear(m.held)
			m.firstErr = cmp.Or(m.firstErr, ctx.Err())
		}
		wait, send := m.due(time.Now())
		if send {
			m.send(ctx)
			continue
		}
		var timer *time.Timer
		var fire <-chan time.Time
		if wait > 0 {
			timer = time.NewTimer(wait)
			fire = timer.C
		}
		select {
		case d := <-m.done:
			m.inflight--
			m.settle(d)
		case <-fire:
		}
		if timer != nil {
			timer.Stop()
		}
	}
	m.marks.Wait()
	return cmp.Or(m.firstErr, m.markErr)
}

// due reports whether an invocation should go now, or else how long until
// the oldest ready batch's wait is over (0: wait for an invocation to end).
func (m *microBatcher) due(now time.Time) (time.Duration, bool) {
	if m.inflight >= m.t.limiter.current() {
		return 0, false
	}
	if len(m.splits) > 0 {
		return 0, true
	}
	if len(m.queue) == 0 {
		return 0, false
	}
	if m.inflight == 0 || m.readyItems >= m.t.cfg.MaxItems || m.readyBytes >= m.t.cfg.MaxBytes {
		return 0, true
	}
	wait := adaptiveWait(m.t.ready.at(now), m.t.cfg.MaxWait, m.u.cfg.WaitTargetRate, m.u.cfg.WaitSteepness)
	left := m.queue[0].since.Add(wait).Sub(now)
	if left <= 0 {
		return 0, true
	}
	return left, false
}

// send packs the queued devices' batches, oldest devices first, into one
// invocation, in flight on its own goroutine until settle receives its
// outcome. A device whose batches do not all fit sends the first ones. The
// half of a split invocation goes first, as it is.
func (m *microBatcher) send(ctx context.Context) {
	if len(m.splits) > 0 {
		sp := m.splits[0]
		m.splits = m.splits[1:]
		m.launch(ctx, sp.pack, sp.since)
		return
	}
	var pack []readyBatch
	bytes, taken, full := envelopeOverhead, 0, false
	for taken < len(m.queue) && !full {
		hw, added := m.queue[taken].hw, 0
		for m.sent[hw] < len(m.byDevice[hw]) && !full {
			rb, size, ok := m.decode(hw)
			if ok && added == 0 {
				size += m.t.history.hintSize(hw) // launch adds the device's hint
			}
			switch {
			case !ok:
				continue
			case len(pack) > 0 && bytes+size > m.t.cfg.MaxBytes:
				full = true
				continue
			}
			pack, bytes, added = append(pack, rb), bytes+size, added+1
			m.sent[hw]++
			full = len(pack) >= m.t.cfg.MaxItems
		}
		if added == 0 && m.sent[hw] < len(m.byDevice[hw]) {
			break // its next batch goes in the next invocation
		}
		taken++
	}
	m.queue = m.queue[taken:]
	m.recount()
	if len(pack) == 0 {
		return
	}
	m.launch(ctx, pack, time.Now())
}

// launch sends one invocation of pack on its own goroutine.
func (m *microBatcher) launch(ctx context.Context, pack []readyBatch, since time.Time) {
	ev := &event.BatchEvent{Items: make([]event.BatchItem, 0, len(pack))}
	for i, rb := range pack {
		ev.Items = append(ev.Items, event.BatchItem{ID: itemID(rb.p), Batch: rb.p.Payload})
		if hw := rb.p.HardwareID; i == 0 || pack[i-1].p.HardwareID != hw {
			if h, ok := m.t.history.hint(hw); ok {
				ev.History = append(ev.History, h)
			}
		}
	}
	m.inflight++
	go func() {
		results, err := m.t.invoke(ctx, ev)
		answering := false
		if err != nil && len(pack) == 1 && blamable(err) {
			// Does the function answer without this batch?
			_, cerr := m.t.invoke(ctx, &event.BatchEvent{})
			answering = cerr == nil
		}
		m.done <- packDone{pack: pack, results: results, err: err, since: since, answering: answering}
	}()
}

// decode returns the device's next unsent batch with its reading span and
// its share of an event's bytes. A batch damaged on disk is dead-lettered
// (kept for an operator) and skipped: ok is false.
func (m *microBatcher) decode(hw string) (readyBatch, int, bool) {
	p := m.byDevice[hw][m.sent[hw]]
	b, withSpan, err := decodeBuffered(p)
	if err == nil {
		return readyBatch{p: withSpan, readings: len(b.Readings), batch: b}, len(p.Payload) + itemOverhead, true
	}
	if st := m.u.settle([]result{damagedBatch(p, err)}); st.err != nil {
		// Kept pending: the device stops here for this round.
		m.firstErr = cmp.Or(m.firstErr, st.err)
		m.sent[hw] = len(m.byDevice[hw])
		return readyBatch{}, 0, false
	}
	m.sent[hw]++
	return readyBatch{}, 0, false
}

// enqueue makes the device's unsent batches ready, if it has any.
func (m *microBatcher) enqueue(hw string, now time.Time) {
	n := len(m.byDevice[hw]) - m.sent[hw]
	if n <= 0 {
		return
	}
	m.queue = append(m.queue, readyDevice{hw: hw, since: now})
	m.t.ready.add(n, now)
	m.recount()
}

// recount sums the queued devices' unsent batches.
func (m *microBatcher) recount() {
	m.readyItems, m.readyBytes = 0, 0
	for _, d := range m.queue {
		for _, p := range m.byDevice[d.hw][m.sent[d.hw]:] {
			m.readyItems++
			m.readyBytes += len(p.Payload) + itemOverhead
		}
	}
}

// itemID is a batch's correlation id: its queue position, unique in the
// buffer.
func itemID(p buffer.Pending) string { return strconv.FormatUint(p.Seq, 10) }

// settle hands an invocation's results to the settle step, each device's
// in order: delivered and duplicate batches are recorded as delivered,
// conflict and rejected ones dead-lettered; any other result (or a failed
// invocation) stops the device for this round, unless it made the batch
// a poison batch (poison.go). A failed invocation of several batches that
// may follow one of them is split instead. A device that did not stop has
// its held batches sent, or else its remaining batches queued again.
func (m *microBatcher) settle(d packDone) {
	now := time.Now()
	if d.err != nil && len(d.pack) > 1 && m.splittable(d) {
		// The failed invocation may have written some of its readings:
		// the halves go without the devices' hints.
		for _, rb := range d.pack {
			m.t.history.forget(rb.p.HardwareID)
		}
		m.split(d)
		return
	}
	if d.err == nil {
		m.noteDelivered(d, now)
	}
	var done []buffer.Pending
	stopped := map[string]bool{}
	var devices []string
	for _, rb := range d.pack {
		hw := rb.p.HardwareID
		if len(devices) == 0 || devices[len(devices)-1] != hw {
			devices = append(devices, hw)
		}
		if stopped[hw] {
			continue
		}
		r, poison := m.judge(rb, d)
		if r.verdict == delivered || r.verdict == duplicate {
			m.t.history.delivered(hw, rb.p.BatchID, rb.batch.Readings)
		} else {
			m.t.history.forget(hw)
		}
		st := m.u.settle([]result{r})
		m.firstErr = cmp.Or(m.firstErr, st.err)
		done = append(done, st.delivered...)
		switch {
		case st.stopped[hw]:
			stopped[hw] = true
		case poison:
			m.t.poison.forget(rb.p.BatchID)
		}
	}
	for _, hw := range devices {
		held := m.held[hw]
		delete(m.held, hw)
		switch {
		case stopped[hw]:
		case len(held) > 0:
			m.splits = append(m.splits, splitPack{pack: held, since: d.since})
		default:
			m.enqueue(hw, now)
		}
	}
	// Recorded per invocation, so that a crash re-sends little.
	m.marks.Go(func() {
		if err := m.u.record(done); err != nil {
			m.markMu.Lock()
			m.markErr = cmp.Or(m.markErr, err)
			m.markMu.Unlock()
		}
	})
}

// judge turns one batch's answer in invocation d into its result, and
// reports whether it made the batch a poison batch.
func (m *microBatcher) judge(rb readyBatch, d packDone) (result, bool) {
	if d.err != nil {
		if len(d.pack) == 1 && blamable(d.err) {
			if r, ok := m.poisoned(rb, "invocation "+invocationKind(d.err), d.err.Error(), d.since, d.answering); ok {
				return r, true
			}
		}
		return result{p: rb.p, verdict: retry, err: d.err}, false
	}
	id := itemID(rb.p)
	r, ok := d.results[id]
	m.t.metrics.results.WithLabelValues(resultLabel(r, ok)).Inc()
	switch {
	case ok && r.Status == event.StatusDelivered:
		return result{p: rb.p, verdict: delivered, readings: rb.readings}, false
	case ok && r.Status == event.StatusDuplicate:
		return result{p: rb.p, verdict: duplicate, readings: rb.readings}, false
	case ok && (r.Status == event.StatusConflict || r.Status == event.StatusRejected):
		reason := fmt.Errorf("the readings function answered %s: %s %s", r.Status, r.Reason, r.Message)
		return refusedBatch(rb.p, reason, "status", r.Status, "reason", r.Reason, "message", r.Message), false
	}
	err := resultError(id, r, ok)
	m.t.reports.failed(err, false)
	if ok && r.Status == event.StatusError && blamableReason(r.Reason) {
		if pr, dead := m.poisoned(rb, "result "+r.Reason, err.Error(), d.since, true); dead {
			return pr, true
		}
	}
	return result{p: rb.p, verdict: retry, err: fmt.Errorf("batch %s: %w", rb.p.BatchID, err)}, false
}
