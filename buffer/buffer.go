package buffer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/prometheus/client_golang/prometheus"

	"greenhouse-gateway/internal/adaptive"
)

// Errors returned by the buffer.
var (
	// ErrClosed is returned by every operation after Close.
	ErrClosed = errors.New("buffer: closed")
	// ErrNotFound is returned when a batch is not in the buffer.
	ErrNotFound = errors.New("buffer: batch not found")
)

const (
	// Stored means the batch is new and is now durably queued.
	Stored Outcome = iota + 1
	// Duplicate means a batch with the same batch_id and the same payload
	// hash is already queued or was delivered within the retention window.
	Duplicate
	// Conflict means the batch_id is known with a different payload.
	Conflict
	// Full means nothing was stored because the buffer reached its disk
	// budget or the disk's free-space watermark.
	Full
	// Limited means nothing was stored because the batch's device or key
	// holds its share of the buffer (Options.DeviceShare, KeyShare), or
	// the device sent new batches faster than Options.DeviceBatchRate;
	// other devices are still stored. Retry later, as for Full.
	Limited
)

// Buffer is the open store: the batch queue, the state records, the
// history and the dead letters of one data directory. Its methods are
// safe for concurrent use.
type Buffer struct {
	dir     string
	opts    Options
	db      *badger.DB
	logger  *slog.Logger
	metrics *metrics

	reqs    chan *commitReq
	closing chan struct{}
	stopped chan struct{}
	notify  chan struct{}

	mu        sync.RWMutex // held for reading by operations, for writing by Close
	closed    bool
	closeOnce sync.Once
	closeErr  error

	// wmu serializes every write (group commits, delivery, dead-lettering,
	// collection, state) so that usage and the eviction scans see a state
	// no other writer changes underneath.
	wmu sync.Mutex

	// floor is where reads of the oldest queue entries start (queue_floor.go).
	floor queueFloor

	// nextSeq is the next queue sequence number; guarded by wmu (the
	// committer's groups and Reforward take numbers from it).
	nextSeq uint64
	// arrivals is the rate of concurrent commit requests (newArrivalRate),
	// owned by the committer goroutine.
	arrivals adaptive.Rate

	free    freeSpace
	ballast ballast
	reclaim reclaimer
	// failure is set by the first failed write (failure.go).
	failure *failure
	dirSync dirSyncer
	// vlogSyncFailed is set when Badger logs that syncing the value log
	// failed: it does not return that error (valueLog.write), so the
	// committer checks this flag before acknowledging.
	vlogSyncFailed *atomic.Bool
	// syncs counts synced Badger transactions and directory fsyncs made
	// for group commits (the benchmark reports it).
	syncs atomic.Int64

	pendingBatches atomic.Int64
	pendingBytes   atomic.Int64
	usage          usage
	// historySpan is the longest reading span (last minus first reading,
	// ms) of a history record, for finding the records overlapping a
	// window through keys ordered by first reading.
	historySpan atomic.Int64

	fullLog  logEvery
	evictLog logEvery
	shareLog logEvery

	// shares is what each device and key holds (queue_shares.go); guarded by
	// wmu.
	shares shares
}

// Open opens or creates the buffer in dir and starts its committer.
// reg may be nil.
//
// Before Badger opens the directory, Open checks that doing so loses
// nothing (checkDirectory): Badger itself silently truncates a damaged
// write-ahead log at the first bad entry and deletes tables its MANIFEST
// does not list. A damaged directory is refused with a *DamagedError,
// which says what is wrong and what to do; a torn write-ahead log tail
// (the last, unacknowledged commit of a crash) is normal and is not damage.
func Open(dir string, opts Options, logger *slog.Logger, reg prometheus.Registerer) (*Buffer, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("component", "buffer")
	clean, memTableSize, err := prepareDirectory(dir, opts, logger)
	if err != nil {
		return nil, err
	}
	bopts := opts
	bopts.MemTableSize = memTableSize
	free := freeSpace{dir: dir, override: opts.freeBytes}
	reserve := newBallast(dir, bopts.MemTableSize, logger)
	freeNow, known := free.bytes()
	reserve.keep(freeNow, known, opts.MinFreeBytes)
	vlogSyncFailed := new(atomic.Bool)
	failed := newFailure(dir, logger, opts.failCommit)
	db, err := badger.Open(badgerOptions(dir, bopts, badgerLogger{l: logger, vlogSyncFailed: vlogSyncFailed, failure: failed}))
	if err != nil {
		return nil, openError(dir, err)
	}
	b := &Buffer{
		dir:            dir,
		opts:           opts,
		db:             db,
		logger:         logger,
		reqs:           make(chan *commitReq, 4096),
		closing:        make(chan struct{}),
		stopped:        make(chan struct{}),
		notify:         make(chan struct{}, 1),
		free:           free,
		ballast:        reserve,
		failure:        failed,
		dirSync:        dirSyncer{dir: dir},
		vlogSyncFailed: vlogSyncFailed,
		fullLog:        logEvery{interval: time.Minute},
		evictLog:       logEvery{interval: time.Minute},
		shareLog:       logEvery{interval: time.Minute},
		arrivals:       newArrivalRate(),
	}
	if err := b.restore(clean); err != nil {
		return nil, errors.Join(err, db.Close())
	}
	b.metrics = newMetrics(reg, b)
	go b.committer()
	logger.Info("buffer open", "dir", dir, "pending_batches", b.pendingBatches.Load(),
		"pending_bytes", b.pendingBytes.Load(), "used_bytes", b.usage.total(),
		"budget_bytes", opts.MaxPendingBytes, "full_policy", opts.FullPolicy,
		"min_free_bytes", opts.MinFreeBytes, "clean_shutdown", clean != nil)
	return b, nil
}

// prepareDirectory runs what must hold before Badger opens dir: no other
// process holds it, and opening it loses nothing (checkDirectory). It
// returns the clean-shutdown record (nil: none, or unreadable, which is
// logged) and the memtable size to open with: a larger one than
// configured while write-ahead logs of that size remain. It removes the
// empty logs a crash right after a start can leave (removeEmptyLogs).
func prepareDirectory(dir string, opts Options, logger *slog.Logger) (*cleanRecord, int64, error) {
	if err := checkNotInUse(dir); err != nil {
		return nil, 0, err
	}
	if err := checkDirectory(dir, logger); err != nil {
		return nil, 0, err
	}
	clean, err := readCleanRecord(dir)
	if err != nil {
		logger.Warn("ignoring the clean-shutdown record", "err", err)
	}
	memTableSize, err := memTableSizeFor(dir, opts.MemTableSize)
	if err != nil {
		return nil, 0, fmt.Errorf("opening buffer %s: %w", dir, err)
	}
	if memTableSize != opts.MemTableSize {
		logger.Info("write-ahead logs of a larger memtable are replayed with their size; "+
			"buffer.memtable_size applies after the next clean stop",
			"memtable_size", memTableSize, "configured", opts.MemTableSize)
	}
	if err := removeEmptyLogs(dir, logger); err != nil {
		return nil, 0, fmt.Errorf("opening buffer %s: %w", dir, err)
	}
	return clean, memTableSize, nil
}

// restore reads the records Badger opened (load), checks them against the
// clean-shutdown record, if any, and removes that record once they match
// (a crash from now on leaves none), then records the directory's state
// for the fsyncs of later commits (dirSyncer).
func (b *Buffer) restore(clean *cleanRecord) error {
	if err := b.load(); err != nil {
		return damaged(b.dir, "reading its records: %v", err)
	}
	if clean != nil {
		if err := clean.matches(b.cleanRecord()); err != nil {
			return damaged(b.dir, "%v", err)
		}
	}
	if err := removeCleanRecord(b.dir); err != nil {
		return fmt.Errorf("opening buffer %s: %w", b.dir, err)
	}
	if err := b.dirSync.init(); err != nil {
		return fmt.Errorf("opening buffer %s: %w", b.dir, err)
	}
	return nil
}

// load reads every record once: it restores the queue counters, the usage
// and the next sequence number, and proves every value readable (values in
// the value log are read and checksummed). Sequence numbers start at 1, so
// Pending(0, n) reads from the start.
func (b *Buffer) load() error {
	s, err := b.scan()
	if err != nil {
		return err
	}
	b.nextSeq = s.nextSeq
	b.store(s)
	return nil
}

// store sets the counters to what a scan found.
func (b *Buffer) store(s scanResult) {
	b.pendingBatches.Store(s.pendingBatches)
	b.pendingBytes.Store(s.pendingBytes)
	b.usage.pending.Store(s.usage.Pending)
	b.usage.delivered.Store(s.usage.Delivered)
	b.usage.dead.Store(s.usage.Dead)
	b.usage.state.Store(s.usage.State)
	b.usage.history.Store(s.usage.History)
	b.usage.deliveredMarkers.Store(s.usage.DeliveredMarkers)
	b.usage.deadBatches.Store(s.usage.DeadBatches)
	b.usage.historyBatches.Store(s.usage.HistoryBatches)
	b.usage.stateRecords.Store(s.stateRecords)
	b.noteSpan(s.historySpan)
	b.shares = newShares(s.devices)
}

// recount recomputes the counters from disk, after a failure left part of
// a write on disk.
func (b *Buffer) recount() {
	s, err := b.scan()
	if err != nil {
		b.logger.Error("recounting the buffer", "err", err)
		return
	}
	b.store(s)
}

// Run collects expired delivery markers and history records and garbage-collects Badger's
// value log until ctx is done.
func (b *Buffer) Run(ctx context.Context) error {
	collect := time.NewTicker(b.opts.CollectInterval)
	defer collect.Stop()
	vlog := time.NewTicker(10 * time.Minute)
	defer vlog.Stop()
	reserve := time.NewTicker(ballastInterval)
	defer reserve.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-reserve.C:
			free, known := b.free.bytes()
			b.ballast.keep(free, known, b.opts.MinFreeBytes)
			b.reclaimSpace(time.Now())
		case <-collect.C:
			if b.logCollected("markers", b.Collect) || b.logCollected("history", b.CollectHistory) {
				return nil
			}
		case <-vlog.C:
			b.mu.RLock()
			if !b.closed {
				b.collectValueLog()
			}
			b.mu.RUnlock()
		}
	}
}

// collectValueLog rewrites and deletes the value log files at least half
// of which is deleted values, one after another while there is one. The
// caller holds mu (read) on an open buffer.
func (b *Buffer) collectValueLog() {
	for b.db.RunValueLogGC(0.5) == nil {
	}
}

// logCollected runs collect, which collects expired what, and logs its
// outcome; it reports whether the buffer was closed.
func (b *Buffer) logCollected(what string, collect func() (int, error)) (closed bool) {
	n, err := collect()
	switch {
	case errors.Is(err, ErrClosed):
		return true
	case err != nil:
		b.logger.Error("collecting expired "+what, "err", err)
	case n > 0:
		b.logger.Debug("collected expired "+what, "count", n)
	}
	return false
}

// ballastInterval is how often Run checks free space for the ballast.
const ballastInterval = 5 * time.Second

// Close stops accepting commits, finishes the commits already queued and
// closes the database. After a clean close it leaves a clean-shutdown
// record that the next Open checks the data against. It is idempotent.
func (b *Buffer) Close() error {
	b.closeOnce.Do(func() {
		b.mu.Lock()
		b.closed = true
		close(b.closing)
		b.mu.Unlock()
		<-b.stopped
		if err := b.failure.failed(); err != nil {
			// Badger is not safe to close after a failed write (it may
			// have no memtable); its files are as the last synced write
			// left them, and the next open replays them.
			b.closeErr = err
			return
		}
		rec := b.cleanRecord()
		if err := b.db.Close(); err != nil {
			b.closeErr = fmt.Errorf("closing buffer %s: %w", b.dir, err)
			return
		}
		if err := writeCleanRecord(b.dir, rec); err != nil {
			b.closeErr = fmt.Errorf("closing buffer %s: %w", b.dir, err)
		}
	})
	return b.closeErr
}

// dirSyncer fsyncs the data directory before a commit is acknowledged when
// its entries may have changed since the last fsync. Badger creates a
// memtable's write-ahead log (a new .mem file) and value log files without
// fsyncing the directory (ristretto z.OpenMmapFileUsing syncs it only for
// files created empty): on a file system that does not order metadata
// updates, a power cut could lose a new .mem file whose commits were
// synced and acknowledged.
//
// A change shows in the directory's modification time, which a stat per
// group reads (about a microsecond). Timestamps are coarse (a clock tick),
// so a change in the same tick as the one last seen would not show: until
// a stat happens more than dirTimeGranularity after the last change, every
// group fsyncs the directory.
type dirSyncer struct {
	dir    string
	synced time.Time // modification time at the last fsync
	// reliable is set when that fsync's stat came long enough after the
	// modification time that any later change has a different one.
	reliable bool
}

// dirTimeGranularity bounds the granularity of directory timestamps: Linux
// file systems with nanosecond timestamps (ext4, xfs, btrfs, f2fs, tmpfs)
// take them from the coarse clock, one tick, at most 10 ms. A data
// directory on a file system with coarser timestamps (FAT: 2 s) is not
// covered.
const dirTimeGranularity = 20 * time.Millisecond

func (d *dirSyncer) init() error {
	_, err := d.sync()
	return err
}

// syncIfChanged fsyncs the directory if it may have changed. Callers hold
// wmu.
func (d *dirSyncer) syncIfChanged() error {
	_, err := d.sync()
	return err
}

func (d *dirSyncer) sync() (bool, error) {
	now := time.Now()
	fi, err := os.Stat(d.dir)
	if err != nil {
		return false, fmt.Errorf("checking the data directory: %w", err)
	}
	mt := fi.ModTime()
	if d.reliable && mt.Equal(d.synced) {
		return false, nil
	}
	if err := syncDir(d.dir); err != nil {
		return false, fmt.Errorf("syncing the data directory: %w", err)
	}
	d.synced, d.reliable = mt, now.Sub(mt) > dirTimeGranularity
	return true, nil
}

// badgerLogger sends Badger's log lines to slog; its info chatter goes to
// debug and its debug lines are dropped. It also notices the one error
// Badger logs instead of returning: a failed sync of the value log.
type badgerLogger struct {
	l              *slog.Logger
	vlogSyncFailed *atomic.Bool
	// failure, when set, is failed by a memtable flush that could not
	// write its table: Badger retries it for ever in the background, while
	// the memtables fill and every later commit waits for one to be free.
	failure *failure
}

// flushFailedPrefix begins what Badger logs when a memtable flush fails
// (DB.flushMemtable).
const flushFailedPrefix = "error flushing memtable to disk"

func (b badgerLogger) Errorf(f string, a ...any) {
	if strings.HasPrefix(f, "Error while curlf sync") && b.vlogSyncFailed != nil {
		b.vlogSyncFailed.Store(true)
	}
	msg := strings.TrimSpace(fmt.Sprintf(f, a...))
	if strings.HasPrefix(f, flushFailedPrefix) && b.failure != nil {
		b.failure.fail(errors.New(msg))
	}
	b.l.Error(msg)
}
func (b badgerLogger) Warningf(f string, a ...any) {
	b.l.Warn(strings.TrimSpace(fmt.Sprintf(f, a...)))
}
func (b badgerLogger) Infof(f string, a ...any) { b.l.Debug(strings.TrimSpace(fmt.Sprintf(f, a...))) }
func (b badgerLogger) Debugf(string, ...any)    {}
