package buffer

import (
	"sync/atomic"
	"time"
)

// reclaimer frees the disk space of deleted records when the free-space
// watermark refuses batches. Deleting a delivered batch only writes a
// tombstone into the memtable; the space its record takes in the tables is
// freed when a compaction merges the two, and on a disk near its watermark
// with little traffic neither the memtable flush nor the compaction may
// come by themselves: the backlog is gone, and batches are still refused.
type reclaimer struct {
	// refused is when the watermark last refused a batch (unix ns).
	refused atomic.Int64
	// last is when space was last reclaimed, and peak the most the budget
	// counted since then, or since first, the budget's count when Run
	// first looked (Run's goroutine only).
	last    time.Time
	peak    int64
	first   int64
	started bool
}

// reclaimInterval is the least time between two reclaims.
const reclaimInterval = 30 * time.Second

// reclaimSpace, while the watermark refuses batches, flushes the memtable
// (its tombstones reach the tables), compacts every level into one
// (Flatten), which drops what the tombstones delete, and collects the
// value log files those deletions freed, at most once per
// reclaimInterval, and only once records of at least a table's size were
// deleted since the last time (while the uplink is down nothing is: a
// Flatten then would only rewrite every table, taking their size again
// from the disk it is meant to free, and hold the next reclaim back
// reclaimInterval after the uplink's deletions come). Called from Run.
func (b *Buffer) reclaimSpace(now time.Time) {
	used := b.usage.total()
	if !b.reclaim.started {
		b.reclaim.started, b.reclaim.first = true, used
	}
	b.reclaim.peak = max(b.reclaim.peak, used)
	refused := time.Unix(0, b.reclaim.refused.Load())
	if now.Sub(refused) > 2*ballastInterval || now.Sub(b.reclaim.last) < reclaimInterval {
		return
	}
	if b.failure.failed() != nil {
		return
	}
	// Before the first time, the tables may also hold what an earlier run
	// deleted, which the budget does not count: that is worth a try while
	// nothing was added since.
	deleted := used <= b.reclaim.peak-tableSize(b.opts.MemTableSize)
	if !deleted && (b.reclaim.last != time.Time{} || used > b.reclaim.first) {
		return
	}
	b.reclaim.last = now
	before, _ := b.free.bytes()
	// The flush happens at the next write: a state record is one. It runs
	// in Badger's background; give it a moment before compacting.
	b.db.RequestFlush()
	if err := b.SaveState(reclaimStateName, []byte(now.UTC().Format(time.RFC3339))); err != nil {
		b.logger.Warn("reclaiming disk space: writing", "err", err)
		return
	}
	time.Sleep(flushWait)
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return
	}
	if err := b.db.Flatten(1); err != nil {
		b.logger.Warn("reclaiming disk space: compacting", "err", err)
		return
	}
	// Values over ValueThreshold (a batch of more than memtable/8) are in
	// the value log, which compactions do not shrink: they count what the
	// deletions freed there, and the collection rewrites what is left of
	// the files mostly freed and deletes them.
	b.collectValueLog()
	b.reclaim.peak = b.usage.total()
	after, _ := b.free.bytes()
	b.logger.Info("free space under buffer.min_free_bytes: flushed and compacted deleted records",
		"free_bytes_before", before, "free_bytes_after", after, "min_free_bytes", b.opts.MinFreeBytes)
}

// flushWait is how long reclaimSpace gives Badger to flush the memtable
// before compacting.
const flushWait = 2 * time.Second

// reclaimStateName is the state record whose write makes the memtable flush.
const reclaimStateName = "reclaim"
