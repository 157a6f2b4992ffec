package buffer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// ErrNotDeadLettered is returned by Reforward for a batch that is known but
// not dead-lettered (pending or delivered).
var ErrNotDeadLettered = errors.New("buffer: batch is not dead-lettered")

// maxReasonBytes bounds the reason kept with a dead letter.
const maxReasonBytes = 1024

// deadReasonTag starts the reason section of a dead letter. A dead letter
// is a queue entry (encodePending) with, between the receive time and the
// payload, the tag, 2 bytes length and the reason. Dead letters written
// before reasons were kept have none: their payload, canonical JSON, starts
// with '{', never with the tag.
const deadReasonTag = 0x00

func encodeDead(p Pending, reason string) []byte {
	if len(reason) > maxReasonBytes {
		reason = strings.ToValidUTF8(reason[:maxReasonBytes], "")
	}
	q := Pending{BatchID: p.BatchID, HardwareID: p.HardwareID, ReceivedAt: p.ReceivedAt}
	v := encodePending(q)
	v = append(v, deadReasonTag)
	v = binary.BigEndian.AppendUint16(v, uint16(len(reason)))
	v = append(v, reason...)
	return append(v, p.Payload...)
}

// decodeDead decodes a dead letter; with payload false it skips the
// payload's copy.
func decodeDead(v []byte, payload bool) (Pending, string, error) {
	p, err := decodePendingHeader(0, v)
	if err != nil {
		return p, "", err
	}
	rest := v[pendingHeaderLen(p):]
	var reason string
	if len(rest) > 0 && rest[0] == deadReasonTag {
		if len(rest) < 3 {
			return p, "", errShortEntry
		}
		n := int(binary.BigEndian.Uint16(rest[1:3]))
		if len(rest) < 3+n {
			return p, "", errShortEntry
		}
		reason = string(rest[3 : 3+n])
		rest = rest[3+n:]
	}
	if len(rest) == 0 {
		return p, "", errors.New("dead letter has no payload")
	}
	if payload {
		p.Payload = append([]byte(nil), rest...)
	}
	return p, reason, nil
}

// DeadLetter is a batch in the dead-letter area.
type DeadLetter struct {
	BatchID        string    `json:"batch_id"`
	HardwareID     string    `json:"hardware_id"`
	ReceivedAt     time.Time `json:"received_at"`
	DeadLetteredAt time.Time `json:"dead_lettered_at,omitzero"`
	// Reason is the cloud's refusal; empty for batches dead-lettered by
	// a gateway that did not keep reasons.
	Reason       string `json:"reason"`
	PayloadBytes int    `json:"payload_bytes"`
}

// deadLetters reads up to limit dead letters (all with limit <= 0) by
// batch_id, and how many there are in all.
func deadLetters(db *badger.DB, limit int) ([]DeadLetter, int, error) {
	var out []DeadLetter
	total := 0
	err := db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: deadPrefix, PrefetchValues: true, PrefetchSize: 16})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			total++
			if limit > 0 && len(out) >= limit {
				continue
			}
			d, err := readDeadLetter(txn, it.Item())
			if err != nil {
				return err
			}
			out = append(out, d)
		}
		return nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("reading dead letters: %w", err)
	}
	return out, total, nil
}

func readDeadLetter(txn *badger.Txn, item *badger.Item) (DeadLetter, error) {
	var d DeadLetter
	err := item.Value(func(v []byte) error {
		p, reason, err := decodeDead(v, false)
		if err != nil {
			return err
		}
		d = DeadLetter{BatchID: p.BatchID, HardwareID: p.HardwareID, ReceivedAt: p.ReceivedAt,
			Reason: reason, PayloadBytes: len(v) - pendingHeaderLen(p) - deadReasonLen(v, p)}
		return nil
	})
	if err != nil {
		return d, fmt.Errorf("dead letter %q: %w", item.Key(), err)
	}
	if m, found, err := markerIn(txn, d.BatchID); err != nil {
		return d, err
	} else if found {
		d.DeadLetteredAt = m.doneAt
	}
	return d, nil
}

// deadReasonLen is the length of a decoded dead letter's reason section.
func deadReasonLen(v []byte, p Pending) int {
	rest := v[pendingHeaderLen(p):]
	if len(rest) >= 3 && rest[0] == deadReasonTag {
		return 3 + int(binary.BigEndian.Uint16(rest[1:3]))
	}
	return 0
}

// DeadLetter moves a batch the cloud refuses permanently out of the queue
// into the dead-letter area, where it is kept with reason (never deleted by
// the buffer) for an operator to inspect (DeadLetters) or re-forward
// (Reforward). A batch no longer queued is skipped.
func (b *Buffer) DeadLetter(p Pending, reason string) error {
	unlock, err := b.lockWrite()
	if err != nil {
		return err
	}
	defer unlock()
	wb := newTxnWriter(b.db, nil, b.failure)
	valLen, queued, err := wb.queued(p.Seq)
	if err != nil {
		wb.discard()
		return err
	}
	m, ok, err := pendingMarker(wb, p, queued)
	if err != nil {
		return err
	}
	if !ok {
		wb.discard()
		b.logger.Warn("batch to dead-letter is no longer queued", "batch_id", p.BatchID, "reason", reason)
		return nil
	}
	m.state = stateDead
	m.doneAt = b.opts.now()
	val := encodeDead(p, reason)
	if err := wb.set(markerKey(p.BatchID), m.encode()); err != nil {
		return err
	}
	if err := wb.set(deadKey(p.BatchID), val); err != nil {
		return err
	}
	if err := wb.delete(queueKey(p.Seq)); err != nil {
		return err
	}
	if err := wb.commit(); err != nil {
		return fmt.Errorf("dead-lettering batch %s: %w", p.BatchID, err)
	}
	b.pendingBatches.Add(-1)
	b.pendingBytes.Add(-int64(valLen))
	b.usage.pending.Add(-pendingCost(len(p.BatchID), valLen))
	b.shares.remove(p.HardwareID, pendingCost(len(p.BatchID), valLen))
	b.usage.dead.Add(deadRecord(len(p.BatchID), len(val)) + markerRecord(len(p.BatchID)))
	b.usage.deadBatches.Add(1)
	b.metrics.deadLettered.Inc()
	b.logger.Warn("batch dead-lettered", "batch_id", p.BatchID, "hardware_id", p.HardwareID, "reason", reason)
	return nil
}

// DeadLetters returns up to limit dead-lettered batches (all with
// limit <= 0), by batch_id, and how many there are in all.
func (b *Buffer) DeadLetters(limit int) ([]DeadLetter, int, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return nil, 0, ErrClosed
	}
	return deadLetters(b.db, limit)
}

// Reforward moves a dead-lettered batch back into the queue, at its end,
// with its marker back to pending, in one synced transaction; the uplink
// then forwards it like any other batch. It takes the next queue sequence
// number, so the batch goes after every batch already queued, including
// its own device's later ones: per-device order is kept for everything
// else, and this batch reaches the cloud after batches its device sent
// later. The budget is not checked: the queue entry takes about what the
// dead letter frees. A batch that is unknown (or whose marker was collected) fails
// with ErrNotFound; a pending or delivered one with ErrNotDeadLettered.
func (b *Buffer) Reforward(batchID string) (Pending, error) {
	unlock, err := b.lockWrite()
	if err != nil {
		return Pending{}, err
	}
	defer unlock()
	w := newTxnWriter(b.db, nil, b.failure)
	m, p, deadLen, err := deadLetterFor(w, batchID)
	if err != nil {
		w.discard()
		return Pending{}, err
	}
	seq := b.nextSeq
	// Sequence numbers are never reused, even if the commit fails.
	b.nextSeq++
	p.Seq = seq
	val := encodePending(p)
	if err := requeue(w, batchID, m, seq, val); err != nil {
		return Pending{}, fmt.Errorf("re-forwarding %s: %w", batchID, err)
	}
	if err := b.commitReforward(w); err != nil {
		b.recount()
		return Pending{}, fmt.Errorf("re-forwarding %s: %w", batchID, err)
	}
	b.pendingBatches.Add(1)
	b.pendingBytes.Add(int64(len(val)))
	b.usage.pending.Add(pendingCost(len(batchID), len(val)))
	b.shares.add(p.HardwareID, "", pendingCost(len(batchID), len(val)))
	b.usage.dead.Add(-(deadRecord(len(batchID), deadLen) + markerRecord(len(batchID))))
	b.usage.deadBatches.Add(-1)
	b.metrics.reforwarded.Inc()
	b.logger.Info("dead letter re-forwarded", "batch_id", batchID, "hardware_id", p.HardwareID, "seq", seq)
	select {
	case b.notify <- struct{}{}:
	default:
	}
	return p, nil
}

// deadLetterFor reads batchID's marker and dead letter through w: the
// marker, the batch and the dead letter's value size. It fails with
// ErrNotFound for an unknown batch and ErrNotDeadLettered for a pending or
// delivered one.
func deadLetterFor(w *txnWriter, batchID string) (marker, Pending, int, error) {
	m, found, err := w.marker(batchID)
	if err != nil {
		return m, Pending{}, 0, err
	}
	if !found {
		return m, Pending{}, 0, fmt.Errorf("%w: %s", ErrNotFound, batchID)
	}
	switch m.state {
	case statePending:
		return m, Pending{}, 0, fmt.Errorf("%w: %s is pending (queued, waiting for the uplink), there is nothing to re-forward",
			ErrNotDeadLettered, batchID)
	case stateDelivered:
		return m, Pending{}, 0, fmt.Errorf("%w: %s was delivered at %s, there is nothing to re-forward",
			ErrNotDeadLettered, batchID, m.doneAt.UTC().Format(time.RFC3339))
	}
	item, err := w.txn.Get(deadKey(batchID))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return m, Pending{}, 0, fmt.Errorf("re-forwarding %s: its marker says dead-lettered but the dead letter is missing", batchID)
	}
	if err != nil {
		return m, Pending{}, 0, fmt.Errorf("reading dead letter %s: %w", batchID, err)
	}
	var p Pending
	var deadLen int
	if err := item.Value(func(v []byte) error {
		deadLen = len(v)
		p, _, err = decodeDead(v, true)
		return err
	}); err != nil {
		return m, Pending{}, 0, fmt.Errorf("reading dead letter %s: %w", batchID, err)
	}
	return m, p, deadLen, nil
}

// requeue writes, through w, batchID's marker back to pending at seq, its
// queue entry val and the next sequence number, and deletes its dead
// letter.
func requeue(w *txnWriter, batchID string, m marker, seq uint64, val []byte) error {
	m.state, m.seq, m.doneAt = statePending, seq, time.Time{}
	var seqVal [8]byte
	binary.BigEndian.PutUint64(seqVal[:], seq+1)
	for _, kv := range []struct{ k, v []byte }{
		{markerKey(batchID), m.encode()}, {queueKey(seq), val}, {seqKey, seqVal[:]},
	} {
		if err := w.set(kv.k, kv.v); err != nil {
			return err
		}
	}
	return w.delete(deadKey(batchID))
}

// commitReforward commits w, synced, and fsyncs the directory if its
// entries changed; Badger only logs a failed msync of the value log, so a
// commit during which its logger saw one fails too.
func (b *Buffer) commitReforward(w *txnWriter) error {
	b.vlogSyncFailed.Store(false)
	err := w.commit()
	if err == nil && b.vlogSyncFailed.Swap(false) {
		err = errors.New("badger could not sync its value log")
	}
	if err == nil {
		err = b.dirSync.syncIfChanged()
	}
	return err
}
