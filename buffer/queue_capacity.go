package buffer

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// Full policies (Options.FullPolicy).
const (
	// PolicyRejectNew refuses new batches with Full once the budget is
	// reached (after evicting delivered markers): devices keep them in their
	// own flash and resend later.
	PolicyRejectNew = "reject_new"
	// PolicyDropOldest deletes the oldest undelivered batches (after
	// evicting delivered markers) to make room for new ones.
	PolicyDropOldest = "drop_oldest"
)

// Eviction reasons, the reason label of gateway_buffer_evicted_batches_total.
const (
	reasonHistoryEvicted = "history_evicted"
	reasonMarkerEvicted  = "marker_evicted"
	reasonDroppedOldest  = "dropped_oldest"
)

// Refusal reasons, the reason label of gateway_buffer_refused_batches_total.
const (
	refusedBudget    = "budget"
	refusedFreeSpace = "free_space"
)

// recordOverhead is what one key/value pair costs Badger beyond the bytes of
// its key and value, rounded up: the 8-byte version appended to every key,
// the entry header and checksum in the write-ahead log, the block entry
// header and offset in a table, and the bloom filter bits.
const recordOverhead = 32

// recordSize is what the budget counts for one record.
func recordSize(keyLen, valueLen int) int64 {
	return int64(keyLen + valueLen + recordOverhead)
}

// What the budget counts per kind of record, by batch_id length and value
// length.
func markerRecord(idLen int) int64 { return recordSize(len(markerPrefix)+idLen, markerSize) }
func expiryRecord(idLen int) int64 { return recordSize(len(expiryPrefix)+8+idLen, 0) }
func queueRecord(valLen int) int64 { return recordSize(len(queuePrefix)+8, valLen) }
func deadRecord(idLen, valLen int) int64 {
	return recordSize(len(deadPrefix)+idLen, valLen)
}

// pendingCost is what one queued batch counts: its queue entry and marker.
func pendingCost(idLen, valLen int) int64 { return queueRecord(valLen) + markerRecord(idLen) }

// deliveredCost is what one delivered batch counts: its marker and its
// entry in the collection index.
func deliveredCost(idLen int) int64 { return markerRecord(idLen) + expiryRecord(idLen) }

// usage is what the buffer holds, by kind, as the budget counts it. Every
// change happens under Buffer.wmu; reads are lock-free.
type usage struct {
	pending   atomic.Int64 // queue entries and their markers
	delivered atomic.Int64 // delivered markers and their collection index entries
	dead      atomic.Int64 // dead letters and their markers
	state     atomic.Int64 // state records (devices, key cache)
	history   atomic.Int64 // delivered payloads kept and their collection index entries

	deliveredMarkers atomic.Int64
	deadBatches      atomic.Int64
	historyBatches   atomic.Int64
	stateRecords     atomic.Int64
}

func (u *usage) total() int64 {
	return u.pending.Load() + u.delivered.Load() + u.dead.Load() + u.state.Load() + u.history.Load()
}

// Usage is what the buffer holds, in bytes as buffer.max_pending_bytes
// counts them: every record's key and value plus 32 bytes of Badger
// overhead. Disk use is higher by Badger's write-ahead log, obsolete
// versions not compacted yet and preallocated files.
type Usage struct {
	// Pending is the queued batches and their markers.
	Pending int64
	// Delivered is the markers kept to answer duplicates, and their
	// collection index entries.
	Delivered int64
	// Dead is the dead-lettered batches and their markers.
	Dead int64
	// State is the gateway's state records (device registry, key cache).
	State int64
	// History is the delivered batches kept for local queries
	// (HistoryRetention) and their collection index entries.
	History int64
	// DeliveredMarkers is how many delivered markers are kept.
	DeliveredMarkers int64
	// DeadBatches is how many batches are dead-lettered.
	DeadBatches int64
	// HistoryBatches is how many delivered batches the history keeps.
	HistoryBatches int64
}

// Total is every byte the budget counts.
func (u Usage) Total() int64 { return u.Pending + u.Delivered + u.Dead + u.State + u.History }

// Usage returns what the buffer holds now.
func (b *Buffer) Usage() Usage {
	return Usage{
		Pending: b.usage.pending.Load(), Delivered: b.usage.delivered.Load(),
		Dead: b.usage.dead.Load(), State: b.usage.state.Load(), History: b.usage.history.Load(),
		DeliveredMarkers: b.usage.deliveredMarkers.Load(), DeadBatches: b.usage.deadBatches.Load(),
		HistoryBatches: b.usage.historyBatches.Load(),
	}
}

// evicted is what one group's evictions freed.
type evicted struct {
	history, historyBytes int64
	markers, markerBytes  int64
	dropped, droppedBytes int64
	// payloadBytes is the queue value bytes dropped (Stats.PendingBytes).
	payloadBytes int64
	// first and last describe the dropped batches, for the log.
	first, last Pending
	// droppedBy is the pending bytes dropped per hardware_id (shares).
	droppedBy map[string]int64
}

// evictMarkers deletes delivered markers, oldest delivery first, through w
// until need bytes are freed or none is left. The caller holds wmu, so the
// committed state it reads cannot change underneath.
func (b *Buffer) evictMarkers(w *txnWriter, need int64, ev *evicted) error {
	var keys [][]byte
	freed := int64(0)
	err := b.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: expiryPrefix})
		defer it.Close()
		for it.Rewind(); it.Valid() && freed < need; it.Next() {
			k := it.Item().KeyCopy(nil)
			keys = append(keys, k)
			freed += deliveredCost(len(k) - len(expiryPrefix) - 8)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("scanning delivered markers: %w", err)
	}
	for _, k := range keys {
		id := string(k[len(expiryPrefix)+8:])
		m, found, err := w.marker(id)
		if err != nil {
			return err
		}
		if err := w.delete(k); err != nil {
			return err
		}
		ev.markerBytes += expiryRecord(len(id))
		if found && m.state == stateDelivered {
			if err := w.delete(markerKey(id)); err != nil {
				return err
			}
			ev.markers++
			ev.markerBytes += markerRecord(len(id))
		}
	}
	return nil
}

// dropOldest deletes undelivered batches, oldest first, through w until
// need bytes are freed or the queue is empty.
func (b *Buffer) dropOldest(w *txnWriter, need int64, ev *evicted) error {
	type victim struct {
		seq uint64
		p   Pending
		n   int
	}
	var victims []victim
	freed := int64(0)
	err := b.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: queuePrefix, PrefetchValues: true, PrefetchSize: 16})
		defer it.Close()
		for it.Rewind(); it.Valid() && freed < need; it.Next() {
			item := it.Item()
			seq, ok := parseQueueKey(item.Key())
			if !ok {
				return fmt.Errorf("malformed queue key %q", item.Key())
			}
			var p Pending
			var n int
			if err := item.Value(func(v []byte) error {
				var err error
				p, err = decodePendingHeader(seq, v)
				n = len(v)
				return err
			}); err != nil {
				return fmt.Errorf("queue entry %d: %w", seq, err)
			}
			victims = append(victims, victim{seq: seq, p: p, n: n})
			freed += pendingCost(len(p.BatchID), n)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("scanning the oldest batches: %w", err)
	}
	for i, v := range victims {
		if err := w.delete(queueKey(v.seq)); err != nil {
			return err
		}
		if err := w.delete(markerKey(v.p.BatchID)); err != nil {
			return err
		}
		ev.dropped++
		ev.droppedBytes += pendingCost(len(v.p.BatchID), v.n)
		if ev.droppedBy == nil {
			ev.droppedBy = map[string]int64{}
		}
		ev.droppedBy[v.p.HardwareID] += pendingCost(len(v.p.BatchID), v.n)
		ev.payloadBytes += int64(v.n)
		if i == 0 {
			ev.first = v.p
		}
		ev.last = v.p
	}
	return nil
}

// logEvery limits a repeated log line to one per interval, counting what
// it suppressed.
type logEvery struct {
	mu         sync.Mutex
	interval   time.Duration
	last       time.Time
	suppressed int64
}

// allow reports whether to log now, and how many events were suppressed
// since the last line.
func (l *logEvery) allow(n int64) (bool, int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now := time.Now(); l.last.IsZero() || now.Sub(l.last) >= l.interval {
		s := l.suppressed
		l.last, l.suppressed = now, 0
		return true, s
	}
	l.suppressed += n
	return false, 0
}
