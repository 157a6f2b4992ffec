package buffer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"
	"sync"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/y"
)

// scanDB reads every record and decodes it. The key space is cut into
// ranges at table boundaries, read in parallel from one snapshot: at start
// (load) this read is most of the time to ready, and with 1,000,000
// readings pending it is bound by decompressing blocks, which parallelizes.
func scanDB(db *badger.DB) (scanResult, error) {
	workers := min(runtime.GOMAXPROCS(0), 8)
	bounds := scanBounds(db, 4*workers)
	// Range i is [bounds[i-1], bounds[i]); the first starts at the first
	// key, the last has no end.
	parts := make([]scanResult, len(bounds)+1)
	errs := make([]error, len(parts))
	txn := db.NewTransaction(false)
	defer txn.Discard()
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range min(workers, len(parts)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				var lo, hi []byte
				if i > 0 {
					lo = bounds[i-1]
				}
				if i < len(bounds) {
					hi = bounds[i]
				}
				parts[i], errs[i] = scanRange(txn, lo, hi)
			}
		}()
	}
	for i := range parts {
		jobs <- i
	}
	close(jobs)
	wg.Wait()

	s := scanResult{nextSeq: 1}
	for i, p := range parts {
		if errs[i] != nil {
			return s, errs[i] // the first in key order, as one pass would
		}
		s.nextSeq = max(s.nextSeq, p.nextSeq)
		s.storedSeq = max(s.storedSeq, p.storedSeq)
		s.pendingBatches += p.pendingBatches
		s.pendingBytes += p.pendingBytes
		s.stateRecords += p.stateRecords
		s.historySpan = max(s.historySpan, p.historySpan)
		s.usage.add(p.usage)
		if s.devices == nil {
			s.devices = p.devices
		} else {
			for hw, n := range p.devices {
				s.devices[hw] += n
			}
		}
	}
	s.nextSeq = max(s.nextSeq, s.storedSeq)
	return s, nil
}

// add adds o's sizes and counts to u.
func (u *Usage) add(o Usage) {
	u.Pending += o.Pending
	u.Delivered += o.Delivered
	u.Dead += o.Dead
	u.State += o.State
	u.History += o.History
	u.DeliveredMarkers += o.DeliveredMarkers
	u.DeadBatches += o.DeadBatches
	u.HistoryBatches += o.HistoryBatches
}

// scanBounds returns up to n-1 increasing keys that cut the key space into
// ranges holding about the same amount of table data.
func scanBounds(db *badger.DB, n int) [][]byte {
	tables := db.Tables()
	if n < 2 || len(tables) < 2 {
		return nil
	}
	slices.SortFunc(tables, func(a, b badger.TableInfo) int { return bytes.Compare(a.Left, b.Left) })
	var total uint64
	for _, t := range tables {
		total += uint64(t.OnDiskSize)
	}
	var bounds [][]byte
	var sum uint64
	for _, t := range tables {
		// Cut before this table once the tables before it hold the next
		// n-th of the data.
		if sum*uint64(n) >= total*uint64(len(bounds)+1) {
			k := y.ParseKey(t.Left)
			if len(bounds) == 0 || bytes.Compare(k, bounds[len(bounds)-1]) > 0 {
				bounds = append(bounds, slices.Clone(k))
			}
		}
		sum += uint64(t.OnDiskSize)
	}
	if len(bounds) > 0 && len(bounds[0]) == 0 {
		bounds = bounds[1:]
	}
	return bounds
}

// scanRange reads the records with keys in [lo, hi) (lo nil: from the
// first; hi nil: to the last).
func scanRange(txn *badger.Txn, lo, hi []byte) (scanResult, error) {
	var s scanResult
	// Values are read in place (no prefetch copies): inline values are
	// in the block the iterator already holds.
	it := txn.NewIterator(badger.IteratorOptions{})
	defer it.Close()
	for it.Seek(lo); it.Valid(); it.Next() {
		item := it.Item()
		k := item.Key()
		if hi != nil && bytes.Compare(k, hi) >= 0 {
			break
		}
		if err := item.Value(func(v []byte) error { return s.record(k, v) }); err != nil {
			return s, err
		}
	}
	return s, nil
}

// record counts one record.
func (s *scanResult) record(k, v []byte) error {
	switch {
	case bytes.HasPrefix(k, queuePrefix):
		seq, ok := parseQueueKey(k)
		if !ok {
			return fmt.Errorf("malformed queue key %q", k)
		}
		p, err := decodePendingHeader(seq, v)
		if err != nil {
			return fmt.Errorf("queue entry %d: %w", seq, err)
		}
		if s.devices == nil {
			s.devices = map[string]int64{}
		}
		s.devices[p.HardwareID] += pendingCost(len(p.BatchID), len(v))
		s.nextSeq = max(s.nextSeq, seq+1)
		s.pendingBatches++
		s.pendingBytes += int64(len(v))
		s.usage.Pending += queueRecord(len(v))
	case bytes.HasPrefix(k, markerPrefix):
		m, err := decodeMarker(v)
		if err != nil {
			return fmt.Errorf("marker %q: %w", k, err)
		}
		size := markerRecord(len(k) - len(markerPrefix))
		switch m.state {
		case statePending:
			s.usage.Pending += size
		case stateDelivered:
			s.usage.Delivered += size
			s.usage.DeliveredMarkers++
		case stateDead:
			s.usage.Dead += size
		}
	case bytes.HasPrefix(k, expiryPrefix):
		if len(k) < len(expiryPrefix)+8 {
			return fmt.Errorf("malformed collection key %q", k)
		}
		s.usage.Delivered += expiryRecord(len(k) - len(expiryPrefix) - 8)
	case bytes.HasPrefix(k, deadPrefix):
		if _, err := decodePendingHeader(0, v); err != nil {
			return fmt.Errorf("dead letter %q: %w", k, err)
		}
		s.usage.Dead += deadRecord(len(k)-len(deadPrefix), len(v))
		s.usage.DeadBatches++
	case bytes.HasPrefix(k, historyPrefix):
		d, err := decodeHistory(v)
		if err != nil {
			return fmt.Errorf("history record %q: %w", k, err)
		}
		s.usage.History += historyRecord(len(k), len(v))
		s.usage.HistoryBatches++
		s.historySpan = max(s.historySpan, d.LastMS-d.FirstMS)
	case bytes.HasPrefix(k, historyIndexPrefix):
		if len(k) < len(historyIndexPrefix)+8 {
			return fmt.Errorf("malformed history index key %q", k)
		}
		hkey, _, err := decodeHistoryIndexValue(v)
		if err != nil {
			return fmt.Errorf("history index entry %q: %w", k, err)
		}
		s.usage.History += historyIndexRecord(len(k)-len(historyIndexPrefix)-8, len(hkey))
	case bytes.HasPrefix(k, statePrefix):
		s.usage.State += recordSize(len(k), len(v))
		s.stateRecords++
	case bytes.Equal(k, seqKey):
		if len(v) != 8 {
			return fmt.Errorf("sequence record has %d bytes, want 8", len(v))
		}
		s.storedSeq = binary.BigEndian.Uint64(v)
	default:
		return fmt.Errorf("unknown record %q", k)
	}
	return nil
}

type scanResult struct {
	nextSeq, storedSeq           uint64
	pendingBatches, pendingBytes int64
	stateRecords                 int64
	historySpan                  int64
	usage                        Usage
	// devices is the pending bytes of each hardware_id (shares).
	devices map[string]int64
}

// scan reads every record and decodes it.
func (b *Buffer) scan() (scanResult, error) { return scanDB(b.db) }
