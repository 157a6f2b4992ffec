package buffer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// Outcome is what a commit did with one batch.
type Outcome int

func (o Outcome) String() string {
	switch o {
	case Stored:
		return "stored"
	case Duplicate:
		return "duplicate"
	case Conflict:
		return "conflict"
	case Full:
		return "full"
	case Limited:
		return "limited"
	}
	return fmt.Sprintf("outcome(%d)", int(o))
}

// Entry is one batch to commit.
type Entry struct {
	BatchID    string
	HardwareID string
	// Hash identifies the payload; a batch_id re-sent with another hash is
	// a conflict.
	Hash [32]byte
	// Payload is the batch as it will be forwarded (canonical JSON).
	Payload    []byte
	ReceivedAt time.Time
	// Key identifies the API key the batch came with (its key_id), for
	// Options.KeyShare; empty when it came with none.
	Key string
}

// Pending is a queued batch handed to the uplink.
type Pending struct {
	// Seq is the batch's position in the queue (arrival order).
	Seq        uint64
	BatchID    string
	HardwareID string
	ReceivedAt time.Time
	Payload    []byte
	// FirstMS and LastMS, when SpanKnown, are the earliest and latest
	// reading times in Payload, as the caller of MarkDelivered decoded
	// them: the history record is then written from Payload without
	// reading and decoding the queue entry again.
	FirstMS, LastMS int64
	SpanKnown       bool
}

// Stats describes the queue at one instant.
type Stats struct {
	PendingBatches int64
	// PendingBytes is the size of the queued batches' entries (payload and
	// batch and hardware ids).
	PendingBytes int64
	// UsedBytes is everything the budget (Options.MaxPendingBytes) counts:
	// Usage().Total().
	UsedBytes int64
	// Oldest is the receive time of the oldest pending batch; zero when
	// nothing is pending.
	Oldest time.Time
}

// Commit durably stores entries and reports, per entry, what it did. It
// returns only after the batches it stored are synced to disk. An error
// means none of the entries may be acknowledged: the commit failed, or the
// buffer is closed.
func (b *Buffer) Commit(ctx context.Context, entries []Entry) ([]Outcome, error) {
	wait, err := b.Submit(ctx, entries)
	if err != nil {
		return nil, err
	}
	return wait()
}

// Submit queues entries for the next group commit and returns at once;
// wait then answers what Commit would, once the group is synced (or
// failed). Requests are committed in the order Submit queued them, so a
// caller that submits one device's batches in order stores them in that
// order without waiting for each. An error from Submit itself means
// nothing was queued.
//
// Submit replaces each entry's HardwareID and Key with a copy of its own:
// the buffer keeps them as keys of its per-device and per-key maps, and a
// substring of a decoded payload would keep the whole payload alive there
// (a map assignment stores the new key's string each time).
func (b *Buffer) Submit(ctx context.Context, entries []Entry) (wait func() ([]Outcome, error), err error) {
	if len(entries) == 0 {
		return func() ([]Outcome, error) { return nil, nil }, nil
	}
	for i := range entries {
		entries[i].HardwareID = strings.Clone(entries[i].HardwareID)
		entries[i].Key = strings.Clone(entries[i].Key)
	}
	if err := b.failure.failed(); err != nil {
		return nil, err
	}
	req := &commitReq{entries: entries, out: make([]Outcome, len(entries)), done: make(chan error, 1)}
	if err := b.enqueue(ctx, req); err != nil {
		return nil, err
	}
	// Once queued, the request is committed or failed by the committer, so
	// wait for it whatever ctx does: answering early could report "not
	// stored" for a batch that is on disk.
	return func() ([]Outcome, error) {
		if err := <-req.done; err != nil {
			return nil, err
		}
		return req.out, nil
	}, nil
}

// lockWrite takes the locks of a write made outside the committer
// (delivery, dead letters, collection): the read lock that holds Close
// back, then wmu. It fails with ErrClosed after Close; otherwise unlock
// releases both.
func (b *Buffer) lockWrite() (unlock func(), err error) {
	b.mu.RLock()
	if b.closed {
		b.mu.RUnlock()
		return nil, ErrClosed
	}
	b.wmu.Lock()
	return func() {
		b.wmu.Unlock()
		b.mu.RUnlock()
	}, nil
}

// enqueue hands req to the committer: ErrClosed after Close, ctx's error
// when ctx ends first. Once it returns nil, the committer answers req.
func (b *Buffer) enqueue(ctx context.Context, req *commitReq) error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return ErrClosed
	}
	select {
	case b.reqs <- req:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Notify returns a channel that receives a value after batches are stored.
func (b *Buffer) Notify() <-chan struct{} { return b.notify }

// Stats returns the current queue size and age.
func (b *Buffer) Stats() Stats {
	s := Stats{PendingBatches: b.pendingBatches.Load(), PendingBytes: b.pendingBytes.Load(),
		UsedBytes: b.usage.total()}
	if s.PendingBatches == 0 {
		return s
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return s
	}
	_ = b.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: queuePrefix, PrefetchValues: false})
		defer it.Close()
		from, _ := b.floor.from(0)
		it.Seek(queueKey(from))
		if !it.Valid() {
			return nil
		}
		if seq, ok := parseQueueKey(it.Item().Key()); ok {
			b.floor.raise(seq)
		}
		return it.Item().Value(func(v []byte) error {
			p, err := decodePendingHeader(0, v)
			if err == nil {
				s.Oldest = p.ReceivedAt
			}
			return err
		})
	})
	return s
}

// Pending returns up to limit queued batches with a sequence number greater
// than after, oldest first.
func (b *Buffer) Pending(after uint64, limit int) ([]Pending, error) {
	out, err := b.readQueue(after, limit, decodePending)
	if err != nil && !errors.Is(err, ErrClosed) {
		return nil, fmt.Errorf("reading pending batches: %w", err)
	}
	return out, err
}

// readQueue decodes up to limit queue entries with a sequence number
// greater than after, oldest first.
func (b *Buffer) readQueue(after uint64, limit int, decode func(seq uint64, v []byte) (Pending, error)) ([]Pending, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return nil, ErrClosed
	}
	if err := b.failure.failed(); err != nil {
		return nil, err
	}
	var out []Pending
	err := b.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: queuePrefix, PrefetchValues: true, PrefetchSize: min(limit, 100)})
		defer it.Close()
		from, atFloor := b.floor.from(after)
		for it.Seek(queueKey(from)); it.Valid() && len(out) < limit; it.Next() {
			item := it.Item()
			seq, ok := parseQueueKey(item.Key())
			if !ok {
				return fmt.Errorf("malformed queue key %q", item.Key())
			}
			if atFloor && len(out) == 0 {
				b.floor.raise(seq)
			}
			if err := item.Value(func(v []byte) error {
				p, err := decode(seq, v)
				if err != nil {
					return fmt.Errorf("queue entry %d: %w", seq, err)
				}
				out = append(out, p)
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	})
	return out, err
}

// MarkDelivered removes delivered batches from the queue and keeps their
// markers for the retention window and, in the same transaction, their
// payloads for the history window (HistoryRetention). A batch no longer queued (dropped by
// the drop_oldest policy while the uplink forwarded it, or already marked)
// is skipped.
func (b *Buffer) MarkDelivered(batches []Pending) error {
	if len(batches) == 0 {
		return nil
	}
	unlock, err := b.lockWrite()
	if err != nil {
		return err
	}
	defer unlock()
	now := b.opts.now()
	var d deliveryCounts
	wb := newTxnWriter(b.db, nil, b.failure)
	for _, p := range batches {
		if err := b.markOneDelivered(wb, p, now, &d); err != nil {
			return err
		}
	}
	if d.n == 0 {
		wb.discard()
		return nil
	}
	if err := wb.commit(); err != nil {
		if wb.written {
			b.recount()
		}
		return fmt.Errorf("marking %d batches delivered: %w", len(batches), err)
	}
	b.pendingBatches.Add(-d.n)
	b.pendingBytes.Add(-d.payload)
	b.usage.pending.Add(-d.pendingFreed)
	for hw, cost := range d.byDevice {
		b.shares.remove(hw, cost)
	}
	b.usage.delivered.Add(d.deliveredAdded)
	b.usage.deliveredMarkers.Add(d.n)
	b.usage.history.Add(d.historyAdded)
	b.usage.historyBatches.Add(d.kept)
	b.metrics.delivered.Add(float64(d.n))
	return nil
}

// deliveryCounts is what MarkDelivered changes in the counters once its
// transaction is committed.
type deliveryCounts struct {
	n, payload, pendingFreed, deliveredAdded int64
	// historyAdded is the bytes of the history records kept for kept
	// batches.
	historyAdded, kept int64
	// byDevice is the pending bytes freed per hardware_id (shares).
	byDevice map[string]int64
}

// markOneDelivered turns p's marker to delivered, indexes it for
// collection, deletes its queue entry and keeps its history record,
// through wb, and adds what that changes to d. A batch no longer queued
// under p.Seq is skipped. A failed read or history record discards the
// transaction; a failed write already did.
func (b *Buffer) markOneDelivered(wb *txnWriter, p Pending, now time.Time, d *deliveryCounts) error {
	q, err := b.readQueued(wb, p)
	if err != nil {
		wb.discard()
		return err
	}
	m, ok, err := pendingMarker(wb, p, q.queued)
	if err != nil || !ok {
		return err
	}
	if b.historyEnabled() && !q.leased && q.val == nil {
		if q.val, _, err = wb.queuedValue(p.Seq); err != nil {
			wb.discard()
			return err
		}
	}
	m.state = stateDelivered
	m.doneAt = now
	if err := wb.set(markerKey(p.BatchID), m.encode()); err != nil {
		return err
	}
	if err := wb.set(expiryKey(now, p.BatchID), nil); err != nil {
		return err
	}
	if err := wb.delete(queueKey(p.Seq)); err != nil {
		return err
	}
	if b.historyEnabled() {
		var added int64
		if q.leased {
			added, err = b.keepHistorySpan(wb, p, p.FirstMS, p.LastMS, now)
		} else {
			added, err = b.keepHistory(wb, p, q.val, now)
		}
		if err != nil {
			wb.discard()
			return err
		}
		if added > 0 {
			d.historyAdded += added
			d.kept++
		}
	}
	d.n++
	d.payload += int64(q.size)
	d.pendingFreed += pendingCost(len(p.BatchID), q.size)
	if d.byDevice == nil {
		d.byDevice = map[string]int64{}
	}
	d.byDevice[p.HardwareID] += pendingCost(len(p.BatchID), q.size)
	d.deliveredAdded += deliveredCost(len(p.BatchID))
	return nil
}

// pendingMarker reads p's marker through wb and reports whether p is still
// the pending batch queued under p.Seq (queued: its queue entry exists).
// A failed read discards wb's transaction.
func pendingMarker(wb *txnWriter, p Pending, queued bool) (marker, bool, error) {
	m, found, err := wb.marker(p.BatchID)
	if err != nil {
		wb.discard()
		return m, false, err
	}
	return m, queued && found && m.state == statePending && m.seq == p.Seq, nil
}

// queuedEntry is what readQueued learns of a batch's queue entry.
type queuedEntry struct {
	queued bool
	size   int
	// val is the entry's value, read only when the history needs it.
	val []byte
	// leased is set when the entry is the leased payload itself, so the
	// history can keep the leased span without reading the value.
	leased bool
}

// readQueued reads p's queue entry: its value only when the history keeps
// it and p does not carry its span, its size otherwise.
func (b *Buffer) readQueued(wb *txnWriter, p Pending) (queuedEntry, error) {
	var q queuedEntry
	var err error
	if b.historyEnabled() && !p.SpanKnown {
		q.val, q.queued, err = wb.queuedValue(p.Seq)
		q.size = len(q.val)
		return q, err
	}
	q.size, q.queued, err = wb.queued(p.Seq)
	// A queue entry is never rewritten: one the size of the leased entry
	// is the leased payload.
	q.leased = p.SpanKnown && q.size == pendingHeaderLen(p)+len(p.Payload)
	return q, err
}

// Lookup returns the state of a batch ("pending", "delivered" or "dead").
func (b *Buffer) Lookup(batchID string) (string, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return "", ErrClosed
	}
	m, err := b.marker(batchID)
	if err != nil {
		return "", err
	}
	return m.state.String(), nil
}

func (b *Buffer) marker(batchID string) (marker, error) {
	var m marker
	err := b.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(markerKey(batchID))
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error {
			var err error
			m, err = decodeMarker(v)
			return err
		})
	})
	if errors.Is(err, badger.ErrKeyNotFound) {
		return m, fmt.Errorf("%w: %s", ErrNotFound, batchID)
	}
	if err != nil {
		return m, fmt.Errorf("reading marker of %s: %w", batchID, err)
	}
	return m, nil
}

// collectChunk bounds how many markers one step of Collect deletes while
// holding the write lock, so that commits wait at most one step.
const collectChunk = 4096

// Collect deletes the markers of batches delivered more than Retention ago
// and returns how many it deleted.
func (b *Buffer) Collect() (int, error) { return b.collectInSteps(b.collectStep) }

// collectInSteps runs step, each time with the write lock held, until it
// reports nothing more to collect, and returns how many it deleted.
func (b *Buffer) collectInSteps(step func() (n int, more bool, err error)) (int, error) {
	total := 0
	for {
		n, more, err := func() (int, bool, error) {
			unlock, err := b.lockWrite()
			if err != nil {
				return 0, false, err
			}
			defer unlock()
			return step()
		}()
		total += n
		if err != nil || !more {
			return total, err
		}
	}
}

// collectStep deletes up to collectChunk expired delivery markers; the
// caller holds the locks (collectInSteps).
func (b *Buffer) collectStep() (int, bool, error) {
	cutoff := b.opts.now().Add(-b.opts.Retention)
	end := expiryKey(cutoff, "")
	var keys [][]byte
	err := b.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: expiryPrefix})
		defer it.Close()
		for it.Rewind(); it.Valid() && len(keys) < collectChunk; it.Next() {
			k := it.Item().KeyCopy(nil)
			if string(k) >= string(end) {
				break
			}
			keys = append(keys, k)
		}
		return nil
	})
	if err != nil {
		return 0, false, fmt.Errorf("scanning expired markers: %w", err)
	}
	if len(keys) == 0 {
		return 0, false, nil
	}
	var freed, markers int64
	wb := newTxnWriter(b.db, nil, b.failure)
	for _, k := range keys {
		id := string(k[len(expiryPrefix)+8:])
		m, found, err := wb.marker(id)
		if err != nil {
			wb.discard()
			return 0, false, err
		}
		if found && m.state == stateDelivered {
			if err := wb.delete(markerKey(id)); err != nil {
				return 0, false, err
			}
			freed += markerRecord(len(id))
			markers++
		}
		if err := wb.delete(k); err != nil {
			return 0, false, err
		}
		freed += expiryRecord(len(id))
	}
	if err := wb.commit(); err != nil {
		if wb.written {
			b.recount()
		}
		return 0, false, fmt.Errorf("deleting expired markers: %w", err)
	}
	b.usage.delivered.Add(-freed)
	b.usage.deliveredMarkers.Add(-markers)
	b.metrics.collected.Add(float64(len(keys)))
	return len(keys), len(keys) == collectChunk, nil
}
