package buffer

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// History: a delivered batch's payload is kept for Options.HistoryRetention
// so that operators can read a device's recent readings on the gateway. It
// is moved out of the queue in the transaction that marks the batch
// delivered, so it costs no write or sync of its own.
//
//	h/<hardware_id> 0x00 <first reading ms, 8 bytes big endian><batch_id>
//	        the batch (same header as a queue entry, then delivery time,
//	        first and last reading time, then the payload)
//	y/<delivered ms, 8 bytes big endian><batch_id>
//	        collection index: 4 bytes length of the h/ value, then the h/ key

var (
	historyPrefix      = []byte("h/")
	historyIndexPrefix = []byte("y/")
)

// historyKey is the key of a delivered batch's history record: one
// device's records are contiguous and ordered by their first reading.
func historyKey(hardwareID string, firstMS int64, batchID string) []byte {
	k := make([]byte, 0, len(historyPrefix)+len(hardwareID)+1+8+len(batchID))
	k = append(k, historyPrefix...)
	k = append(k, hardwareID...)
	k = append(k, 0)
	k = binary.BigEndian.AppendUint64(k, uint64(max(firstMS, 0)))
	return append(k, batchID...)
}

// historyDevicePrefix is the prefix of every history record of a device.
func historyDevicePrefix(hardwareID string) []byte {
	k := make([]byte, 0, len(historyPrefix)+len(hardwareID)+1)
	k = append(k, historyPrefix...)
	k = append(k, hardwareID...)
	return append(k, 0)
}

func historyIndexKey(deliveredAt time.Time, batchID string) []byte {
	k := make([]byte, len(historyIndexPrefix)+8, len(historyIndexPrefix)+8+len(batchID))
	copy(k, historyIndexPrefix)
	binary.BigEndian.PutUint64(k[len(historyIndexPrefix):], uint64(max(deliveredAt.UnixMilli(), 0)))
	return append(k, batchID...)
}

func historyIndexValue(hkey []byte, valLen int) []byte {
	v := make([]byte, 4, 4+len(hkey))
	binary.BigEndian.PutUint32(v, uint32(valLen))
	return append(v, hkey...)
}

func decodeHistoryIndexValue(v []byte) (hkey []byte, valLen int, err error) {
	if len(v) < 4+len(historyPrefix) || !bytes.HasPrefix(v[4:], historyPrefix) {
		return nil, 0, fmt.Errorf("history index entry of %d bytes does not name a history record", len(v))
	}
	return v[4:], int(binary.BigEndian.Uint32(v)), nil
}

// What the budget counts for history records.
func historyRecord(keyLen, valLen int) int64 { return recordSize(keyLen, valLen) }
func historyIndexRecord(idLen, hkeyLen int) int64 {
	return recordSize(len(historyIndexPrefix)+8+idLen, 4+hkeyLen)
}

// historyCost is what one history record and its index entry count.
func historyCost(idLen, hkeyLen, valLen int) int64 {
	return historyRecord(hkeyLen, valLen) + historyIndexRecord(idLen, hkeyLen)
}

// historyTrailer is the delivery time and the first and last reading
// times that follow a history record's header.
const historyTrailer = 8 + 8 + 8

// encodeHistory encodes a history record: the queue entry's header (batch_id,
// hardware_id, receive time), the delivery time, the first and last reading
// time, all in Unix milliseconds, then the payload.
func encodeHistory(p Pending, deliveredAt time.Time, firstMS, lastMS int64) []byte {
	v := make([]byte, 0, pendingHeaderLen(p)+historyTrailer+len(p.Payload))
	v = binary.BigEndian.AppendUint16(v, uint16(len(p.BatchID)))
	v = append(v, p.BatchID...)
	v = binary.BigEndian.AppendUint16(v, uint16(len(p.HardwareID)))
	v = append(v, p.HardwareID...)
	v = binary.BigEndian.AppendUint64(v, uint64(p.ReceivedAt.UnixMilli()))
	v = binary.BigEndian.AppendUint64(v, uint64(deliveredAt.UnixMilli()))
	v = binary.BigEndian.AppendUint64(v, uint64(firstMS))
	v = binary.BigEndian.AppendUint64(v, uint64(lastMS))
	return append(v, p.Payload...)
}

// decodeHistory decodes a history record; its Payload aliases v.
func decodeHistory(v []byte) (DeviceBatch, error) {
	p, err := decodePendingHeader(0, v)
	if err != nil {
		return DeviceBatch{}, err
	}
	rest := v[pendingHeaderLen(p):]
	if len(rest) < historyTrailer {
		return DeviceBatch{}, errShortEntry
	}
	d := DeviceBatch{
		BatchID: p.BatchID, HardwareID: p.HardwareID, ReceivedAt: p.ReceivedAt, Delivered: true,
		DeliveredAt: time.UnixMilli(int64(binary.BigEndian.Uint64(rest))),
		FirstMS:     int64(binary.BigEndian.Uint64(rest[8:])),
		LastMS:      int64(binary.BigEndian.Uint64(rest[16:])),
		Payload:     rest[historyTrailer:],
	}
	if d.LastMS < d.FirstMS {
		return DeviceBatch{}, fmt.Errorf("history record of %s: last reading %d before first %d", d.BatchID, d.LastMS, d.FirstMS)
	}
	return d, nil
}

// readingSpan returns the earliest and latest timestamp_ms of a batch
// payload (the contract's canonical JSON).
func readingSpan(payload []byte) (first, last int64, err error) {
	var b struct {
		Readings []struct {
			TimestampMS *int64 `json:"timestamp_ms"`
		} `json:"readings"`
	}
	if err := json.Unmarshal(payload, &b); err != nil {
		return 0, 0, fmt.Errorf("reading the batch's timestamps: %w", err)
	}
	if len(b.Readings) == 0 {
		return 0, 0, errors.New("reading the batch's timestamps: the batch has no readings")
	}
	for i, r := range b.Readings {
		if r.TimestampMS == nil {
			return 0, 0, fmt.Errorf("reading the batch's timestamps: readings[%d] has no timestamp_ms", i)
		}
		if i == 0 || *r.TimestampMS < first {
			first = *r.TimestampMS
		}
		if i == 0 || *r.TimestampMS > last {
			last = *r.TimestampMS
		}
	}
	return first, last, nil
}

// DeviceBatch is one batch of a device held locally: pending (queued for
// the uplink) or delivered and kept in the history.
type DeviceBatch struct {
	BatchID    string
	HardwareID string
	ReceivedAt time.Time
	// Delivered is set for history records; DeliveredAt is then the time
	// the uplink delivered the batch.
	Delivered   bool
	DeliveredAt time.Time
	// FirstMS and LastMS are the batch's earliest and latest reading
	// times, Unix milliseconds.
	FirstMS, LastMS int64
	// Payload is the batch's canonical JSON. It is valid only during the
	// callback of DeviceBatches.
	Payload []byte
}

// DeviceBatches calls fn with every batch of hardwareID held locally whose
// readings overlap [fromMS, toMS) (first reading before toMS, last reading
// at or after fromMS): first the delivered batches kept in the history, by
// first reading time, then the pending ones in queue order. A pending
// batch is marked delivered while DeviceBatches runs is seen once, in
// whichever place it was when read. An error from fn stops the scan and is
// returned.
//
// History records are found through their key (hardware_id, first reading
// time); pending batches by scanning the queue, which has no per-device
// index (BenchmarkDeviceBatchesPendingScan measures it).
func (b *Buffer) DeviceBatches(hardwareID string, fromMS, toMS int64, fn func(DeviceBatch) error) error {
	if toMS <= fromMS {
		return nil
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return ErrClosed
	}
	err := b.db.View(func(txn *badger.Txn) error {
		prefix := historyDevicePrefix(hardwareID)
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: true, PrefetchSize: 16})
		// A record starting before fromMS overlaps when its span reaches
		// fromMS: start no earlier than the longest span kept.
		seek := historyKey(hardwareID, max(fromMS, 0)-b.historySpan.Load(), "")
		for it.Seek(seek); it.Valid(); it.Next() {
			k := it.Item().Key()
			if len(k) < len(prefix)+8 {
				it.Close()
				return fmt.Errorf("malformed history key %q", k)
			}
			if int64(binary.BigEndian.Uint64(k[len(prefix):])) >= toMS {
				break
			}
			if err := it.Item().Value(func(v []byte) error {
				d, err := decodeHistory(v)
				if err != nil {
					return fmt.Errorf("history record %q: %w", k, err)
				}
				if d.LastMS < fromMS {
					return nil
				}
				return fn(d)
			}); err != nil {
				it.Close()
				return err
			}
		}
		it.Close()

		it = txn.NewIterator(badger.IteratorOptions{Prefix: queuePrefix, PrefetchValues: true, PrefetchSize: 100})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			seq, ok := parseQueueKey(item.Key())
			if !ok {
				return fmt.Errorf("malformed queue key %q", item.Key())
			}
			if err := item.Value(func(v []byte) error {
				p, err := decodePendingHeader(seq, v)
				if err != nil {
					return fmt.Errorf("queue entry %d: %w", seq, err)
				}
				if p.HardwareID != hardwareID {
					return nil
				}
				payload := v[pendingHeaderLen(p):]
				first, last, err := readingSpan(payload)
				if err != nil {
					return fmt.Errorf("queue entry %d (%s): %w", seq, p.BatchID, err)
				}
				if first >= toMS || last < fromMS {
					return nil
				}
				return fn(DeviceBatch{BatchID: p.BatchID, HardwareID: p.HardwareID, ReceivedAt: p.ReceivedAt,
					FirstMS: first, LastMS: last, Payload: payload})
			}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("reading the batches of %s: %w", hardwareID, err)
	}
	return nil
}

// historyEnabled reports whether delivered payloads are kept.
func (b *Buffer) historyEnabled() bool { return b.opts.HistoryRetention > 0 }

// keepHistory writes, through w, the history record of a batch being marked
// delivered, whose queue entry is val, and returns what it adds to the
// budget (0 when the payload's reading times cannot be read; the batch is
// then not kept).
func (b *Buffer) keepHistory(w *txnWriter, p Pending, val []byte, now time.Time) (int64, error) {
	qp, err := decodePending(p.Seq, val)
	if err != nil {
		return 0, fmt.Errorf("queue entry %d: %w", p.Seq, err)
	}
	first, last, err := readingSpan(qp.Payload)
	if err != nil {
		b.logger.Warn("delivered batch not kept in the history", "batch_id", qp.BatchID, "err", err)
		return 0, nil
	}
	return b.keepHistorySpan(w, qp, first, last, now)
}

// keepHistorySpan writes the history record of qp, whose readings span
// first to last.
func (b *Buffer) keepHistorySpan(w *txnWriter, qp Pending, first, last int64, now time.Time) (int64, error) {
	if last < first {
		return 0, fmt.Errorf("history record of %s: last reading %d before first %d", qp.BatchID, last, first)
	}
	hkey := historyKey(qp.HardwareID, first, qp.BatchID)
	hval := encodeHistory(qp, now, first, last)
	if err := w.set(hkey, hval); err != nil {
		return 0, err
	}
	if err := w.set(historyIndexKey(now, qp.BatchID), historyIndexValue(hkey, len(hval))); err != nil {
		return 0, err
	}
	b.noteSpan(last - first)
	return historyCost(len(qp.BatchID), len(hkey), len(hval)), nil
}

// noteSpan raises the longest reading span of a history record.
func (b *Buffer) noteSpan(span int64) {
	for {
		cur := b.historySpan.Load()
		if span <= cur || b.historySpan.CompareAndSwap(cur, span) {
			return
		}
	}
}

// historyVictim is a history record found through its index entry.
type historyVictim struct {
	index, hkey []byte
	idLen       int
	cost        int64
}

// scanHistoryIndex returns index entries, oldest delivery first, up to end
// (exclusive; nil for no bound), until need bytes are covered or limit
// entries are found.
func (b *Buffer) scanHistoryIndex(end []byte, need int64, limit int) ([]historyVictim, error) {
	var out []historyVictim
	freed := int64(0)
	err := b.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: historyIndexPrefix, PrefetchValues: true, PrefetchSize: 100})
		defer it.Close()
		for it.Rewind(); it.Valid() && freed < need && len(out) < limit; it.Next() {
			item := it.Item()
			if end != nil && bytes.Compare(item.Key(), end) >= 0 {
				break
			}
			k := item.KeyCopy(nil)
			if len(k) < len(historyIndexPrefix)+8 {
				return fmt.Errorf("malformed history index key %q", k)
			}
			v, err := item.ValueCopy(nil)
			if err != nil {
				return err
			}
			hkey, valLen, err := decodeHistoryIndexValue(v)
			if err != nil {
				return fmt.Errorf("%q: %w", k, err)
			}
			idLen := len(k) - len(historyIndexPrefix) - 8
			hv := historyVictim{index: k, hkey: hkey, idLen: idLen, cost: historyCost(idLen, len(hkey), valLen)}
			out = append(out, hv)
			freed += hv.cost
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("scanning the history: %w", err)
	}
	return out, nil
}

// evictHistory deletes history records, oldest delivery first, through w
// until need bytes are freed or none is left. The caller holds wmu.
func (b *Buffer) evictHistory(w *txnWriter, need int64, ev *evicted) error {
	victims, err := b.scanHistoryIndex(nil, need, 1<<30)
	if err != nil {
		return err
	}
	for _, v := range victims {
		if err := w.delete(v.hkey); err != nil {
			return err
		}
		if err := w.delete(v.index); err != nil {
			return err
		}
		ev.history++
		ev.historyBytes += v.cost
	}
	return nil
}

// CollectHistory deletes the history records of batches delivered more
// than HistoryRetention ago (all of them when history is off) and returns
// how many it deleted.
func (b *Buffer) CollectHistory() (int, error) { return b.collectInSteps(b.collectHistoryStep) }

// collectHistoryStep deletes up to collectChunk expired history records;
// the caller holds the locks (collectInSteps).
func (b *Buffer) collectHistoryStep() (int, bool, error) {
	cutoff := b.opts.now()
	if b.historyEnabled() {
		cutoff = cutoff.Add(-b.opts.HistoryRetention)
	}
	victims, err := b.scanHistoryIndex(historyIndexKey(cutoff, ""), 1<<62, collectChunk)
	if err != nil || len(victims) == 0 {
		return 0, false, err
	}
	var freed int64
	wb := newTxnWriter(b.db, nil, b.failure)
	for _, v := range victims {
		if err := wb.delete(v.hkey); err != nil {
			return 0, false, err
		}
		if err := wb.delete(v.index); err != nil {
			return 0, false, err
		}
		freed += v.cost
	}
	if err := wb.commit(); err != nil {
		if wb.written {
			b.recount()
		}
		return 0, false, fmt.Errorf("deleting expired history: %w", err)
	}
	b.usage.history.Add(-freed)
	b.usage.historyBatches.Add(-int64(len(victims)))
	b.metrics.collectedHistory.Add(float64(len(victims)))
	return len(victims), len(victims) == collectChunk, nil
}
