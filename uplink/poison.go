package uplink

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"greenhouse-gateway/function/event"
)

// Poison batches (lambda target). An invocation that fails as a whole
// with a function error, or with any other invocation error while other
// invocations deliver, is split in two, and the halves are sent again,
// until the batch that makes it fail is alone in its invocation; the
// other devices' batches go on meanwhile. A device is split only at the
// end of its first half: its later batches wait for the first half to be
// settled. A failure that follows one batch (its invocation of that batch
// alone fails, or the function answers error for it) counts against the
// batch only when other batches were delivered since its invocation, or
// its split, began; once one failure was counted so, later ones count
// while the function answers (the per-item error's invocation itself, or
// an empty event sent after the batch's invocation failed), so that a
// device left alone with its poison batch is not stalled. An outage (no
// answer, throttling, a function that fails on everything) blames
// nothing. At uplink.lambda.poison_failures
// counted failures with the same answer, or at a counted failure
// uplink.lambda.poison_time after the first, the batch is dead-lettered
// with its last error and its device goes on.

// suspect is a batch whose forwarding failed in a way that follows it.
type suspect struct {
	class   string    // the kind of answer: failures of another kind start again
	counted int       // failures counted against it
	first   time.Time // its first counted failure
	lastErr string
}

// poisonState is the lambda target's record of suspects and of the last
// delivery, shared by rounds.
type poisonState struct {
	mu        sync.Mutex
	suspects  map[string]*suspect // by batch_id
	delivered time.Time           // the last batch delivered by an answered invocation
}

// maxSuspects bounds the record; past it the oldest knowledge is dropped
// (the batches are counted again from nothing).
const maxSuspects = 4096

// noteDelivered records that an answer delivered batches at now, and that
// those batches are no longer suspects.
func (p *poisonState) noteDelivered(now time.Time, batchIDs []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now.After(p.delivered) {
		p.delivered = now
	}
	for _, id := range batchIDs {
		delete(p.suspects, id)
	}
}

// counted returns the failures counted against a batch.
func (p *poisonState) counted(batchID string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.suspects[batchID]; s != nil {
		return s.counted
	}
	return 0
}

// forget drops a batch that was dead-lettered.
func (p *poisonState) forget(batchID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.suspects, batchID)
}

// deliveredSince reports whether a batch was delivered after since.
func (p *poisonState) deliveredSince(since time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delivered.After(since)
}

// fail records a failure of class that follows the batch, in an attempt
// that began at since, and reports whether the batch is to be
// dead-lettered now, and the failures counted against it. A failure is
// counted when something else was delivered since the attempt began, or
// when one was counted before and the function answers (answering).
func (p *poisonState) fail(batchID, class, errText string, since, now time.Time, answering bool, cfg LambdaConfig) (bool, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.suspects == nil {
		p.suspects = map[string]*suspect{}
	}
	s := p.suspects[batchID]
	if s == nil {
		if len(p.suspects) >= maxSuspects {
			clear(p.suspects)
		}
		s = &suspect{}
		p.suspects[batchID] = s
	}
	s.lastErr = errText
	if !p.delivered.After(since) && (s.counted == 0 || !answering) {
		return false, s.counted // nothing else went through: not its fault
	}
	if s.class != class {
		s.class, s.counted, s.first = class, 0, time.Time{}
	}
	s.counted++
	if s.first.IsZero() {
		s.first = now
	}
	if strings.HasPrefix(class, "result ") {
		// An error result is the cloud's own trouble with the batch (a
		// DynamoDB error), which may pass: only one that lasts
		// PoisonTime too makes it a poison batch. A crash that follows
		// the batch is one at PoisonFailures.
		return s.counted >= cfg.PoisonFailures && now.Sub(s.first) >= cfg.PoisonTime, s.counted
	}
	return s.counted >= cfg.PoisonFailures || (s.counted > 1 && now.Sub(s.first) >= cfg.PoisonTime), s.counted
}

// poisonReason is a poison batch's dead-letter reason.
func poisonReason(counted int, errText string) string {
	return fmt.Sprintf("the readings function failed on this batch %d times while other batches were delivered; last error: %s", counted, errText)
}

// blamableReason reports whether an error result's reason may follow its
// batch: not a later batch left unattempted behind an earlier one, nor a
// throttled write.
func blamableReason(reason string) bool {
	// request_refused: DynamoDB refused the request's shape or the
	// endpoint's limits, never the batch's content; it is retried.
	return reason != "not_attempted" && reason != "throttled" && reason != "request_refused"
}

// blamable reports whether a failed invocation may follow its batches: a
// function error, or any other error of the invocation itself but
// throttling (not the gateway's own, such as its shutdown).
func blamable(err error) bool {
	var ie *invocationError
	return errors.As(err, &ie) && ie.kind != "throttled"
}

// splittable reports whether a failed invocation is split: a function
// error, or another invocation error while other batches are delivered.
func (m *microBatcher) splittable(d packDone) bool {
	if !blamable(d.err) {
		return false
	}
	return invocationKind(d.err) == "function_error" || m.t.poison.deliveredSince(d.since)
}

// split sends a failed invocation again as two halves: at the device
// boundary nearest its middle, or, with one device, its first half, the
// rest held until that half is settled.
func (m *microBatcher) split(d packDone) {
	m.t.metrics.splits.Inc()
	pack, mid, cut := d.pack, len(d.pack)/2, 0
	for i := 1; i < len(pack); i++ {
		if pack[i].p.HardwareID != pack[i-1].p.HardwareID && (cut == 0 || abs(i-mid) < abs(cut-mid)) {
			cut = i
		}
	}
	if cut > 0 {
		m.splits = append(m.splits, splitPack{pack: pack[:cut], since: d.since}, splitPack{pack: pack[cut:], since: d.since})
		return
	}
	half, hw := (len(pack)+1)/2, pack[0].p.HardwareID
	m.held[hw] = append(slices.Clone(pack[half:]), m.held[hw]...)
	m.splits = append(m.splits, splitPack{pack: pack[:half], since: d.since})
}

func abs(n int) int { return max(n, -n) }

// noteDelivered records an answer's delivered batches in the poison
// record before its failures are judged.
func (m *microBatcher) noteDelivered(d packDone, now time.Time) {
	var ids []string
	for _, rb := range d.pack {
		if r, ok := d.results[itemID(rb.p)]; ok && (r.Status == event.StatusDelivered || r.Status == event.StatusDuplicate) {
			ids = append(ids, rb.p.BatchID)
		}
	}
	if len(ids) > 0 {
		m.t.poison.noteDelivered(now, ids)
	}
}

// poisoned counts a failure of class that follows the batch and reports
// whether it made the batch a poison batch, with the result that
// dead-letters it: its device goes on.
func (m *microBatcher) poisoned(rb readyBatch, class, errText string, since time.Time, answering bool) (result, bool) {
	before := m.t.poison.counted(rb.p.BatchID)
	dead, counted := m.t.poison.fail(rb.p.BatchID, class, errText, since, time.Now(), answering, m.t.cfg)
	if counted > before {
		m.u.progress.Add(1) // blamed on this batch, not on the uplink
	}
	if !dead {
		return result{}, false
	}
	return result{p: rb.p, verdict: refused, err: errors.New(poisonReason(counted, errText)),
		log:   "the readings function keeps failing on a batch while others are delivered; moved to the dead-letter area",
		attrs: []any{"failures", counted, "err", errText}}, true
}
