package uplink

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/function/event"
)

// The lambda target's micro-buffer (seed 004 §5.5). A round's batches
// become ready device by device: a device's oldest batch at once, each
// later one only when the one before it is settled (delivered or
// dead-lettered), so a device's later batch is never delivered before an
// earlier one, and no invocation holds two batches of one device. Ready
// batches are packed, in the order they became ready, into invocations of
// at most uplink.lambda.max_items batches and max_bytes bytes. An
// invocation goes as soon as it is full, or when nothing is in flight
// (nothing more can become ready), or when the oldest ready batch has
// waited the adaptive wait: uplink.lambda.max_wait scaled by the sigmoid
// of the rate at which batches become ready. The invocations in flight
// are bounded by their own AIMD limit.

// itemOverhead is an event item's bytes besides its batch: the id and
// the JSON around them.
const (
	itemOverhead     = 48
	envelopeOverhead = 256
)

// readyBatch is a device batch whose earlier batches are settled.
type readyBatch struct {
	p        buffer.Pending // with its reading span
	readings int
	since    time.Time // when it became ready
}

// packDone is one invocation's outcome.
type packDone struct {
	pack    []readyBatch
	results map[string]event.ItemResult
	err     error
}

type microBatcher struct {
	u          *Uplink
	t          *lambdaTarget
	byDevice   map[string][]buffer.Pending
	next       map[string]int
	ready      []readyBatch
	readyBytes int
	inflight   int
	done       chan packDone
	firstErr   error

	marks   sync.WaitGroup
	markMu  sync.Mutex
	markErr error
}

// forwardInvocations forwards a round's batches through the readings
// function and returns the first error; a device whose batch failed stops
// for the round.
func (u *Uplink) forwardInvocations(ctx context.Context, order []string, byDevice map[string][]buffer.Pending) error {
	m := &microBatcher{u: u, t: u.lambda, byDevice: byDevice, next: make(map[string]int, len(order)), done: make(chan packDone)}
	now := time.Now()
	for _, hw := range order {
		m.push(hw, now)
	}
	for len(m.ready) > 0 || m.inflight > 0 {
		if ctx.Err() != nil {
			m.ready, m.readyBytes = nil, 0
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
	if len(m.ready) == 0 || m.inflight >= m.t.limiter.current() {
		return 0, false
	}
	if m.inflight == 0 || len(m.ready) >= m.t.cfg.MaxItems || m.readyBytes >= m.t.cfg.MaxBytes {
		return 0, true
	}
	wait := adaptiveWait(m.t.ready.at(now), m.t.cfg.MaxWait, m.u.cfg.WaitTargetRate, m.u.cfg.WaitSteepness)
	left := m.ready[0].since.Add(wait).Sub(now)
	if left <= 0 {
		return 0, true
	}
	return left, false
}

// send packs the oldest ready batches into one invocation, in flight on
// its own goroutine until settle receives its outcome.
func (m *microBatcher) send(ctx context.Context) {
	n, bytes := 0, envelopeOverhead
	for n < len(m.ready) && n < m.t.cfg.MaxItems {
		size := len(m.ready[n].p.Payload) + itemOverhead
		if n > 0 && bytes+size > m.t.cfg.MaxBytes {
			break
		}
		bytes += size
		n++
	}
	pack := append([]readyBatch(nil), m.ready[:n]...)
	m.ready = m.ready[n:]
	m.readyBytes -= bytes - envelopeOverhead
	ev := &event.BatchEvent{Items: make([]event.BatchItem, 0, n)}
	for _, rb := range pack {
		ev.Items = append(ev.Items, event.BatchItem{ID: itemID(rb.p), Batch: rb.p.Payload})
	}
	m.inflight++
	go func() {
		results, err := m.t.invoke(ctx, ev)
		m.done <- packDone{pack: pack, results: results, err: err}
	}()
}

// itemID is a batch's correlation id: its queue position, unique in the
// buffer.
func itemID(p buffer.Pending) string { return strconv.FormatUint(p.Seq, 10) }

// settle applies an invocation's results: delivered and duplicate batches
// are recorded as delivered, conflict and rejected ones dead-lettered,
// and their devices' next batches become ready; any other result (or a
// failed invocation) stops the device for this round.
func (m *microBatcher) settle(d packDone) {
	now := time.Now()
	var delivered []buffer.Pending
	for _, rb := range d.pack {
		if d.err != nil {
			m.firstErr = cmp.Or(m.firstErr, d.err)
			continue
		}
		hw, id := rb.p.HardwareID, itemID(rb.p)
		r, ok := d.results[id]
		m.t.metrics.results.WithLabelValues(resultLabel(r, ok)).Inc()
		switch {
		case ok && (r.Status == event.StatusDelivered || r.Status == event.StatusDuplicate):
			delivered = append(delivered, rb.p)
			m.u.metrics.batches.WithLabelValues(map[bool]string{true: "delivered", false: "already_delivered"}[r.Status == event.StatusDelivered]).Inc()
			m.u.metrics.readings.Add(float64(rb.readings))
		case ok && (r.Status == event.StatusConflict || r.Status == event.StatusRejected):
			reason := fmt.Sprintf("the readings function answered %s: %s %s", r.Status, r.Reason, r.Message)
			if err := m.u.deadLetter(rb.p, reason); err != nil {
				m.firstErr = cmp.Or(m.firstErr, fmt.Errorf("dead-lettering %s: %w", rb.p.BatchID, err))
				continue
			}
			m.u.metrics.batches.WithLabelValues("dead_lettered").Inc()
			m.u.logger.Error("cloud refused a batch permanently; moved to the dead-letter area",
				"batch_id", rb.p.BatchID, "hardware_id", hw, "status", r.Status, "reason", r.Reason, "message", r.Message)
		default:
			m.firstErr = cmp.Or(m.firstErr, fmt.Errorf("batch %s: %w", rb.p.BatchID, resultError(id, r, ok)))
			continue
		}
		m.next[hw]++
		m.push(hw, now)
	}
	// Recorded per invocation, so that a crash re-sends little.
	m.marks.Go(func() {
		if err := m.u.markDelivered(delivered); err != nil {
			m.markMu.Lock()
			m.markErr = cmp.Or(m.markErr, fmt.Errorf("recording delivery: %w", err))
			m.markMu.Unlock()
		}
	})
}

// push makes the device's next batch ready. A batch damaged on disk is
// dead-lettered (kept for an operator) and the one after it taken.
func (m *microBatcher) push(hw string, now time.Time) {
	for m.next[hw] < len(m.byDevice[hw]) {
		p := m.byDevice[hw][m.next[hw]]
		b, withSpan, err := decodeBuffered(p)
		if err == nil {
			m.ready = append(m.ready, readyBatch{p: withSpan, readings: len(b.Readings), since: now})
			m.readyBytes += len(p.Payload) + itemOverhead
			m.t.ready.add(1, now)
			return
		}
		if dlErr := m.u.deadLetter(p, err.Error()); dlErr != nil {
			m.firstErr = cmp.Or(m.firstErr, fmt.Errorf("dead-lettering %s: %w", p.BatchID, dlErr))
			return
		}
		m.u.metrics.batches.WithLabelValues("dead_lettered").Inc()
		m.next[hw]++
	}
}
