package buffer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// committer is the only goroutine that creates markers and queue entries.
// It takes every request waiting, commits them in one synced transaction
// (group commit) and then answers all of them.
func (b *Buffer) committer() {
	defer close(b.stopped)
	for {
		select {
		case req := <-b.reqs:
			b.commitGroup(b.gather(req))
		case <-b.closing:
			// Close holds no request back: everything queued before it is
			// committed and answered.
			for {
				select {
				case req := <-b.reqs:
					b.commitGroup(b.gather(req))
				default:
					return
				}
			}
		}
	}
}

// gather returns first plus every request already waiting, up to the group
// caps.
func (b *Buffer) gather(first *commitReq) []*commitReq {
	group := []*commitReq{first}
	n := len(first.entries)
	for n < b.opts.MaxGroupBatches {
		select {
		case req := <-b.reqs:
			group = append(group, req)
			n += len(req.entries)
		default:
			return group
		}
	}
	return group
}

func (b *Buffer) commitGroup(group []*commitReq) {
	start := time.Now()
	stored, storedBytes, err := b.writeGroup(group)
	if err != nil {
		b.metrics.commitFailures.Inc()
		b.logger.Error("group commit failed; its batches are not acknowledged", "err", err,
			"requests", len(group))
		for _, req := range group {
			req.done <- err
		}
		return
	}
	b.pendingBatches.Add(int64(stored))
	b.pendingBytes.Add(storedBytes)
	n := 0
	for _, req := range group {
		n += len(req.entries)
		for _, o := range req.out {
			b.metrics.outcomes.WithLabelValues(o.String()).Inc()
		}
		req.done <- nil
	}
	b.metrics.groupBatches.Observe(float64(n))
	b.metrics.commitSeconds.Observe(time.Since(start).Seconds())
	if stored > 0 {
		select {
		case b.notify <- struct{}{}:
		default:
		}
	}
}

// writeGroup decides every entry's outcome and writes the new ones. It
// returns the number and bytes of batches stored.
func (b *Buffer) writeGroup(group []*commitReq) (_ int, _ int64, err error) {
	type seen struct {
		hash [32]byte
	}
	inGroup := make(map[string]seen)
	w := newTxnWriter(b.db)
	seq := b.nextSeq
	defer func() {
		// Sequence numbers are never reused, even after a failure: part of
		// a split group may be on disk.
		b.nextSeq = seq
		if err != nil && w.written {
			b.recount()
		}
	}()
	var stored int
	var storedBytes int64
	full := b.fullReason()
	for _, req := range group {
		for i, e := range req.entries {
			if s, ok := inGroup[e.BatchID]; ok {
				req.out[i] = sameOrConflict(s.hash, e.Hash)
				continue
			}
			m, found, err := w.marker(e.BatchID)
			if err != nil {
				w.discard()
				return 0, 0, err
			}
			if found {
				req.out[i] = sameOrConflict(m.hash, e.Hash)
				continue
			}
			val := encodePending(Pending{BatchID: e.BatchID, HardwareID: e.HardwareID,
				ReceivedAt: e.ReceivedAt, Payload: e.Payload})
			if full == "" && b.pendingBytes.Load()+storedBytes+int64(len(val)) > b.opts.MaxPendingBytes {
				full = "disk budget (buffer.max_pending_bytes) reached"
			}
			if full != "" {
				req.out[i] = Full
				continue
			}
			mk := marker{state: statePending, hash: e.Hash, seq: seq, receivedAt: e.ReceivedAt}
			if err := w.set(markerKey(e.BatchID), mk.encode()); err != nil {
				return 0, 0, err
			}
			if err := w.set(queueKey(seq), val); err != nil {
				return 0, 0, err
			}
			inGroup[e.BatchID] = seen{hash: e.Hash}
			req.out[i] = Stored
			seq++
			stored++
			storedBytes += int64(len(val))
		}
	}
	if stored == 0 {
		w.discard()
		return 0, 0, nil
	}
	var seqVal [8]byte
	binary.BigEndian.PutUint64(seqVal[:], seq)
	if err := w.set(seqKey, seqVal[:]); err != nil {
		return 0, 0, err
	}
	if b.opts.beforeCommit != nil {
		if err := b.opts.beforeCommit(); err != nil {
			w.discard()
			return 0, 0, err
		}
	}
	if err := w.commit(); err != nil {
		return 0, 0, fmt.Errorf("committing %d batches: %w", stored, err)
	}
	return stored, storedBytes, nil
}

// fullReason says why new batches must be refused, or "".
func (b *Buffer) fullReason() string {
	if free, ok := b.free.bytes(); ok && free < uint64(b.opts.MinFreeBytes) {
		return "free disk space below buffer.min_free_bytes"
	}
	return ""
}

func sameOrConflict(stored, got [32]byte) Outcome {
	if stored == got {
		return Duplicate
	}
	return Conflict
}

// txnWriter writes through one Badger transaction, committing and starting
// a new one when the transaction grows too big. Every commit is synced.
type txnWriter struct {
	db  *badger.DB
	txn *badger.Txn
	// written is set when some transaction already committed: a later
	// failure then leaves part of the group on disk, which is safe (its
	// members are not acknowledged, and a resend is a duplicate).
	written bool
}

func newTxnWriter(db *badger.DB) *txnWriter {
	return &txnWriter{db: db, txn: db.NewTransaction(true)}
}

func (w *txnWriter) marker(batchID string) (marker, bool, error) {
	item, err := w.txn.Get(markerKey(batchID))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return marker{}, false, nil
	}
	if err != nil {
		return marker{}, false, fmt.Errorf("reading marker of %s: %w", batchID, err)
	}
	var m marker
	err = item.Value(func(v []byte) error {
		m, err = decodeMarker(v)
		return err
	})
	if err != nil {
		return marker{}, false, fmt.Errorf("reading marker of %s: %w", batchID, err)
	}
	return m, true, nil
}

func (w *txnWriter) set(k, v []byte) error {
	return w.apply(func(txn *badger.Txn) error { return txn.Set(k, v) })
}

func (w *txnWriter) delete(k []byte) error {
	return w.apply(func(txn *badger.Txn) error { return txn.Delete(k) })
}

func (w *txnWriter) apply(op func(*badger.Txn) error) error {
	err := op(w.txn)
	if errors.Is(err, badger.ErrTxnTooBig) {
		if err = w.txn.Commit(); err != nil {
			return fmt.Errorf("committing a full transaction: %w", err)
		}
		w.written = true
		w.txn = w.db.NewTransaction(true)
		err = op(w.txn)
	}
	if err != nil {
		w.txn.Discard()
	}
	return err
}

func (w *txnWriter) commit() error { return w.txn.Commit() }

func (w *txnWriter) discard() { w.txn.Discard() }
