package audit

import (
	"sync/atomic"
	"syscall"
	"time"
)

// Causes of dropped attempts, the cause label of
// gateway_audit_dropped_records_total.
const (
	causeQueueFull  = "queue_full"
	causeFreeSpace  = "free_space"
	causeWriteError = "write_error"
)

// Causes of deleted segments, the cause label of
// gateway_audit_deleted_segments_total.
const (
	deletedRetention = "retention"
	deletedMaxBytes  = "max_bytes"
)

// summaryInterval is the least time between two log lines that summarise
// the attempts dropped meanwhile.
const summaryInterval = time.Minute

// lostCounts counts dropped attempts by cause, between two summaries;
// logged is when the last summary was logged (Unix nanoseconds).
type lostCounts struct {
	queueFull, freeSpace, writeError atomic.Int64
	logged                           atomic.Int64
}

// statfsFree reads the free bytes of dir's file system (one statfs,
// about a microsecond).
func statfsFree(dir string) func() (uint64, bool) {
	return func() (uint64, bool) {
		var st syscall.Statfs_t
		if err := syscall.Statfs(dir, &st); err != nil {
			return 0, false
		}
		return uint64(st.Bavail) * uint64(st.Bsize), true
	}
}

// roomLocked reports whether n more bytes may be written while the free
// space stays at or over Config.MinFreeBytes, counting the bytes still in
// the write buffer. Free space that cannot be read does not stop writing.
func (l *Log) roomLocked(n int) bool {
	if l.cfg.MinFreeBytes <= 0 {
		return true
	}
	free, ok := l.free()
	if !ok {
		return true
	}
	if l.w != nil {
		n += l.w.Buffered()
	}
	return free >= uint64(l.cfg.MinFreeBytes)+uint64(n)
}

// drop counts n attempts lost for cause.
func (l *Log) drop(cause string, n int64) {
	l.dropped.WithLabelValues(cause).Add(float64(n))
	switch cause {
	case causeQueueFull:
		l.lost.queueFull.Add(n)
	case causeFreeSpace:
		l.lost.freeSpace.Add(n)
	default:
		l.lost.writeError.Add(n)
	}
}

// summarizeLost logs the attempts dropped since the last summary in one
// line, when there are some and the last summary is a minute old. Run
// calls it every second: the first drops are logged at once, then at most
// one line a minute.
func (l *Log) summarizeLost() {
	now := time.Now().UnixNano()
	last := l.lost.logged.Load()
	if last != 0 && now-last < int64(summaryInterval) {
		return
	}
	if l.lost.queueFull.Load()+l.lost.freeSpace.Load()+l.lost.writeError.Load() == 0 ||
		!l.lost.logged.CompareAndSwap(last, now) {
		return
	}
	q, f, w := l.lost.queueFull.Swap(0), l.lost.freeSpace.Swap(0), l.lost.writeError.Swap(0)
	free, _ := l.free()
	l.logger.Warn("audit records dropped in the last minute (counted in gateway_audit_dropped_records_total)",
		"queue_full", q, "free_space", f, "write_error", w, "free_bytes", free, "min_free_bytes", l.cfg.MinFreeBytes)
}
