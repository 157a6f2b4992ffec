package buffer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
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

// Outcome is what a commit did with one batch.
type Outcome int

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

// Options configure a Buffer. The zero value of a field means its default.
type Options struct {
	// MaxPendingBytes is the buffer's disk budget in bytes. It counts every
	// record the buffer keeps: queued batches and their markers, delivered
	// markers kept for the retention window (and their collection index),
	// history records, dead-lettered batches, and state records, each as
	// key + value + 32 bytes of Badger overhead (Usage). When a new batch
	// would exceed it, the oldest history records are evicted first, then
	// the oldest delivered markers; if that is not enough, FullPolicy
	// decides. Default 1 GiB.
	MaxPendingBytes int64 `yaml:"max_pending_bytes"`
	// MinFreeBytes is the free-space watermark of the data directory's file
	// system: below it new batches are refused with Full, whatever
	// FullPolicy says. It must cover the most Badger can still write after
	// the last admitted batch (RequiredFreeBytes: memtable flushes and
	// compactions write new files before deleting old ones). Default
	// 256 MiB, and never less than RequiredFreeBytes(MemTableSize).
	MinFreeBytes int64 `yaml:"min_free_bytes"`
	// FullPolicy is what happens when the budget is reached and evicting
	// delivered markers does not make enough room: "reject_new" (default)
	// refuses new batches with Full (devices keep them in their own flash
	// and resend later); "drop_oldest" deletes the oldest undelivered
	// batches to make room, counted (gateway_buffer_evicted_batches_total
	// {reason="dropped_oldest"}) and logged.
	FullPolicy string `yaml:"full_policy"`
	// Retention is how long a delivered batch's marker is kept to answer
	// "duplicate". Default 168h (7 days). Markers may go earlier when the
	// budget needs their space.
	Retention time.Duration `yaml:"retention"`
	// HistoryRetention is how long a delivered batch's payload is kept after
	// delivery so that operators can read a device's recent readings on
	// the gateway (GET /v1/devices/{hardware_id}/readings and /summary).
	// Default 24h (zero takes the default, like every option); a negative
	// duration such as -1s turns the history off, and what is kept is
	// collected at the next collection. History is the first thing evicted
	// when the budget needs room.
	HistoryRetention time.Duration `yaml:"history_retention"`
	// CollectInterval is how often expired markers are collected. Default 1m.
	CollectInterval time.Duration `yaml:"collect_interval"`
	// MaxGroupBatches caps how many batches one group commit takes. Default 1024.
	MaxGroupBatches int `yaml:"max_group_batches"`
	// GroupMaxWait is the longest the committer waits for more commits
	// before writing a group, when the observed rate of concurrent commits
	// (those arriving while another commit waits or is being written) says
	// more are about to come: the wait follows a sigmoid of that rate, 0
	// when it is 0 (a lone device never waits for itself), GroupMaxWait/2
	// at GroupWaitRate (see groupWait). A full group (MaxGroupBatches) is
	// written at once. 0, the default, does not wait: the committer takes
	// what is queued, which already groups the commits that arrived while
	// the previous group was being synced. At most 100ms.
	GroupMaxWait time.Duration `yaml:"group_max_wait"`
	// GroupWaitRate is the rate of concurrent commits, per second, at
	// which the committer waits half of GroupMaxWait. Default 2000.
	GroupWaitRate float64 `yaml:"group_wait_rate"`
	// MemTableSize is Badger's memtable size in bytes. Default 8 MiB,
	// sized for a 1 GB Raspberry Pi: each memtable holds about 1.3 times
	// this on the heap, and flushing one about twice this more (doc.go,
	// Memory). A smaller value applies only after the write-ahead logs of
	// the larger one are flushed (the next clean stop).
	MemTableSize int64 `yaml:"memtable_size"`
	// BlockCacheSize is Badger's block cache in bytes. Default 8 MiB.
	BlockCacheSize int64 `yaml:"block_cache_size"`
	// DeviceShare is the fraction of the capacity one device (hardware_id)
	// may hold in undelivered batches; past it the device's new batches
	// are refused with Limited while every other device is still stored.
	// The capacity is MaxPendingBytes, or less when the disk has less
	// room above MinFreeBytes: what the buffer holds plus that room. A
	// device may always hold its fair share of the devices seen (1/N of
	// the N devices with batches queued or that stored one in the last 10
	// minutes) when that is more, so a lone device may fill the buffer. A
	// device holding nothing is always let in with one batch. Default
	// 0.125 (one eighth); 1 turns it off.
	DeviceShare float64 `yaml:"device_share"`
	// KeyShare is the fraction of the capacity the devices one API key
	// last sent for may hold together (a fleet key's devices; a device
	// key's device), or 1/K of the K keys with batches queued when that
	// is more. Default 0.5; 1 turns it off.
	KeyShare float64 `yaml:"key_share"`
	// DeviceBatchRate is how many new batches (batch_ids not seen before)
	// a second one device may store, sustained, after a burst of
	// DeviceBatchBurst; past it its new batches are refused with
	// Limited. Default 20; a negative value turns it off.
	DeviceBatchRate float64 `yaml:"device_batch_rate"`
	// DeviceBatchBurst is how many new batches one device may store at
	// once before DeviceBatchRate applies. Default 10000.
	DeviceBatchBurst int `yaml:"device_batch_burst"`

	// now replaces time.Now in tests.
	now func() time.Time
	// beforeCommit, when set, is called with each group transaction before
	// it commits; an error fails the group (tests inject disk failures).
	beforeCommit func() error
	// failCommit, when set, is called instead of each Badger commit; an
	// error stands for a failed write of the disk (tests).
	failCommit func() error
	// freeBytes, when set, replaces the data directory's statfs (tests).
	freeBytes func() (uint64, bool)
	// tuneBadger, when set, changes the Badger options after
	// badgerOptions (benchmarks compare settings with it).
	tuneBadger func(*badger.Options)
}

// DefaultOptions returns the defaults documented on Options.
func DefaultOptions() Options {
	return Options{
		MaxPendingBytes:  1 << 30,
		MinFreeBytes:     256 << 20,
		FullPolicy:       PolicyRejectNew,
		Retention:        7 * 24 * time.Hour,
		HistoryRetention: 24 * time.Hour,
		CollectInterval:  time.Minute,
		MaxGroupBatches:  1024,
		GroupWaitRate:    2000,
		MemTableSize:     8 << 20,
		BlockCacheSize:   8 << 20,
		DeviceShare:      defaultDeviceShare,
		KeyShare:         defaultKeyShare,
		DeviceBatchRate:  defaultDeviceBatchRate,
		DeviceBatchBurst: defaultDeviceBatchBurst,
	}
}

// RequiredFreeBytes is the least free space (buffer.min_free_bytes) that
// keeps Badger from filling the disk with a memtable of memTableSize bytes.
// Once new batches are refused, Badger may still: flush the memtables (an
// L0 table of up to one memtable is written before its write-ahead log is
// deleted, and each new write-ahead log is allocated at twice the
// memtable), compact L0 into the base level (up to 8 L0 tables, the stall
// limit, plus the base level, up to twice its 5-table target, written
// before the inputs are deleted), run one lower-level compaction at the
// same time (one table plus the ten it overlaps), start a value log file
// (allocated at twice valueLogFileSize), and take the small writes of
// delivery and state. That is 13 memtables, 22 tables and a value log
// file; the formula adds two memtables and two tables of margin:
// 15*memtable + 24*table + 2*vlog, where a table is memtable/8 between 256
// KiB and 2 MiB and a value log file twice the memtable. With the default
// 8 MiB memtable: 176 MiB.
func RequiredFreeBytes(memTableSize int64) int64 {
	if memTableSize == 0 {
		memTableSize = DefaultOptions().MemTableSize
	}
	return 15*memTableSize + 24*tableSize(memTableSize) + 2*valueLogFileSize(memTableSize)
}

// valueLogFileSize is Badger's value log file size: only values over
// ValueThreshold (memtable/8, at most 1 MiB) go there, and Badger
// allocates each file at twice this size, so it is kept small: twice the
// memtable.
func valueLogFileSize(memTableSize int64) int64 {
	return 2 * memTableSize
}

// tableSize is the size of Badger's tables below L0 (BaseTableSize).
func tableSize(memTableSize int64) int64 {
	return min(max(memTableSize/8, 256<<10), 2<<20)
}

// Validate reports the first invalid field.
func (o Options) Validate() error {
	switch {
	case o.MaxPendingBytes < 0:
		return errors.New("buffer.max_pending_bytes: must not be negative")
	case o.MinFreeBytes < 0:
		return errors.New("buffer.min_free_bytes: must not be negative")
	case o.MemTableSize != 0 && o.MemTableSize < 1<<20:
		return errors.New("buffer.memtable_size: must be at least 1 MiB")
	case o.MemTableSize > 1<<30:
		return errors.New("buffer.memtable_size: must be at most 1 GiB")
	case o.MinFreeBytes != 0 && o.MinFreeBytes < RequiredFreeBytes(o.MemTableSize):
		return fmt.Errorf("buffer.min_free_bytes: %d is less than %d, the most Badger may still write once "+
			"new batches are refused with buffer.memtable_size %d (memtable flushes and compactions); "+
			"set it to at least %d or lower buffer.memtable_size",
			o.MinFreeBytes, RequiredFreeBytes(o.MemTableSize), cmp.Or(o.MemTableSize, DefaultOptions().MemTableSize),
			RequiredFreeBytes(o.MemTableSize))
	case o.FullPolicy != "" && o.FullPolicy != PolicyRejectNew && o.FullPolicy != PolicyDropOldest:
		return fmt.Errorf("buffer.full_policy: %q is not one of %s, %s", o.FullPolicy, PolicyRejectNew, PolicyDropOldest)
	case o.Retention < 0:
		return errors.New("buffer.retention: must not be negative")
	case o.CollectInterval < 0:
		return errors.New("buffer.collect_interval: must not be negative")
	case o.MaxGroupBatches < 0:
		return errors.New("buffer.max_group_batches: must not be negative")
	case o.GroupMaxWait < 0 || o.GroupMaxWait > 100*time.Millisecond:
		return fmt.Errorf("buffer.group_max_wait: %s is not between 0 and 100ms", o.GroupMaxWait)
	case o.GroupWaitRate < 0 || math.IsNaN(o.GroupWaitRate) || math.IsInf(o.GroupWaitRate, 0):
		return fmt.Errorf("buffer.group_wait_rate: %v is not a non-negative number of commits per second", o.GroupWaitRate)
	case o.BlockCacheSize < 0:
		return errors.New("buffer.block_cache_size: must not be negative")
	case !(o.DeviceShare >= 0 && o.DeviceShare <= 1):
		return fmt.Errorf("buffer.device_share: %v is not a fraction between 0 and 1", o.DeviceShare)
	case !(o.KeyShare >= 0 && o.KeyShare <= 1):
		return fmt.Errorf("buffer.key_share: %v is not a fraction between 0 and 1", o.KeyShare)
	case math.IsNaN(o.DeviceBatchRate) || math.IsInf(o.DeviceBatchRate, 0):
		return fmt.Errorf("buffer.device_batch_rate: %v is not a number of batches per second", o.DeviceBatchRate)
	case o.DeviceBatchBurst < 0:
		return errors.New("buffer.device_batch_burst: must not be negative")
	}
	return nil
}

func (o Options) withDefaults() Options {
	d := DefaultOptions()
	if o.MaxPendingBytes == 0 {
		o.MaxPendingBytes = d.MaxPendingBytes
	}
	if o.MemTableSize == 0 {
		o.MemTableSize = d.MemTableSize
	}
	if o.MinFreeBytes == 0 {
		o.MinFreeBytes = max(d.MinFreeBytes, RequiredFreeBytes(o.MemTableSize))
	}
	if o.FullPolicy == "" {
		o.FullPolicy = d.FullPolicy
	}
	if o.Retention == 0 {
		o.Retention = d.Retention
	}
	if o.HistoryRetention == 0 {
		o.HistoryRetention = d.HistoryRetention
	}
	if o.CollectInterval == 0 {
		o.CollectInterval = d.CollectInterval
	}
	if o.MaxGroupBatches == 0 {
		o.MaxGroupBatches = d.MaxGroupBatches
	}
	if o.GroupMaxWait == 0 {
		o.GroupMaxWait = d.GroupMaxWait
	}
	if o.GroupWaitRate == 0 {
		o.GroupWaitRate = d.GroupWaitRate
	}
	if o.BlockCacheSize == 0 {
		o.BlockCacheSize = d.BlockCacheSize
	}
	if o.DeviceShare == 0 {
		o.DeviceShare = d.DeviceShare
	}
	if o.KeyShare == 0 {
		o.KeyShare = d.KeyShare
	}
	if o.DeviceBatchRate == 0 {
		o.DeviceBatchRate = d.DeviceBatchRate
	}
	if o.DeviceBatchBurst == 0 {
		o.DeviceBatchBurst = d.DeviceBatchBurst
	}
	if o.now == nil {
		o.now = time.Now
	}
	return o
}

// badgerOptions are the Badger settings of a buffer; doc.go explains them.
func badgerOptions(dir string, o Options, logger badger.Logger) badger.Options {
	bo := badgerSettings(dir, o, logger)
	if o.tuneBadger != nil {
		o.tuneBadger(&bo)
	}
	return bo
}

// badgerSettings are the Badger settings of badgerOptions, before tests
// tune them.
func badgerSettings(dir string, o Options, logger badger.Logger) badger.Options {
	ts := tableSize(o.MemTableSize)
	vlog := valueLogFileSize(o.MemTableSize)
	bo := badger.DefaultOptions(dir).
		WithSyncWrites(true).
		WithDetectConflicts(false).
		WithMemTableSize(o.MemTableSize).
		// Values must fit one transaction (15% of a memtable); larger
		// ones go to the value log, which is synced the same way.
		WithValueThreshold(min(1<<20, o.MemTableSize/8)).
		// The memtable being written and one being flushed: each holds
		// an arena of about 1.3 memtables on the heap, and a flush's
		// table builder about twice the memtable.
		WithNumMemtables(2).
		// 16 KiB blocks: a block holds several batches of ten readings
		// (about 2.4 KB each), and table builders hold every block of a
		// table twice (as written and compressed) in allocations of the
		// block size, so fewer, fuller blocks keep the builders of
		// memtable flushes and compactions small (doc.go, Memory).
		WithBlockSize(16 << 10).
		WithBlockCacheSize(o.BlockCacheSize).
		WithValueLogFileSize(vlog).
		WithNumCompactors(2).
		// Bounded L0 and equal-sized tables keep the space a compaction
		// needs bounded (RequiredFreeBytes).
		WithNumLevelZeroTables(4).
		WithNumLevelZeroTablesStall(8).
		WithBaseTableSize(ts).
		WithBaseLevelSize(5 * ts).
		// Tables are verified whole before opening (checkDirectory); blocks
		// again when read. Values read from the value log are verified.
		WithChecksumVerificationMode(options.OnBlockRead).
		WithVerifyValueChecksum(true).
		WithLogger(logger)
	bo.TableSizeMultiplier = 1 // no With method
	return bo
}

type commitReq struct {
	entries []Entry
	out     []Outcome
	done    chan error
}

// Buffer is the durable queue. Its methods are safe for concurrent use.
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

	// floor is where reads of the oldest queue entries start (floor.go).
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

	// shares is what each device and key holds (shares.go); guarded by
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
func (b *Buffer) Submit(ctx context.Context, entries []Entry) (wait func() ([]Outcome, error), err error) {
	if len(entries) == 0 {
		return func() ([]Outcome, error) { return nil, nil }, nil
	}
	if err := b.failure.failed(); err != nil {
		return nil, err
	}
	req := &commitReq{entries: entries, out: make([]Outcome, len(entries)), done: make(chan error, 1)}
	b.mu.RLock()
	if b.closed {
		b.mu.RUnlock()
		return nil, ErrClosed
	}
	select {
	case b.reqs <- req:
		b.mu.RUnlock()
	case <-ctx.Done():
		b.mu.RUnlock()
		return nil, ctx.Err()
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
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return ErrClosed
	}
	b.wmu.Lock()
	defer b.wmu.Unlock()
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
	m, found, err := wb.marker(p.BatchID)
	if err != nil {
		wb.discard()
		return err
	}
	if !q.queued || !found || m.state != statePending || m.seq != p.Seq {
		return nil
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

// DeadLetter moves a batch the cloud refuses permanently out of the queue
// into the dead-letter area, where it is kept with reason (never deleted by
// the buffer) for an operator to inspect (DeadLetters) or re-forward
// (Reforward). A batch no longer queued is skipped.
func (b *Buffer) DeadLetter(p Pending, reason string) error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return ErrClosed
	}
	b.wmu.Lock()
	defer b.wmu.Unlock()
	wb := newTxnWriter(b.db, nil, b.failure)
	valLen, queued, err := wb.queued(p.Seq)
	if err != nil {
		wb.discard()
		return err
	}
	m, found, err := wb.marker(p.BatchID)
	if err != nil {
		wb.discard()
		return err
	}
	if !queued || !found || m.state != statePending || m.seq != p.Seq {
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

// LoadState returns a small state record saved with SaveState, or nil.
func (b *Buffer) LoadState(name string) ([]byte, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return nil, ErrClosed
	}
	var out []byte
	err := b.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(stateKey(name))
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		out, err = item.ValueCopy(nil)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("loading state %s: %w", name, err)
	}
	return out, nil
}

// LoadStates returns every state record whose name starts with prefix,
// by name.
func (b *Buffer) LoadStates(prefix string) (map[string][]byte, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return nil, ErrClosed
	}
	out := map[string][]byte{}
	err := b.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: stateKey(prefix), PrefetchValues: true})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			out[string(it.Item().Key()[len(statePrefix):])] = v
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("loading states %s*: %w", prefix, err)
	}
	return out, nil
}

// SaveState durably stores a small state record under name. State records
// count towards the budget but are never evicted.
func (b *Buffer) SaveState(name string, value []byte) error {
	return b.SaveStates(map[string][]byte{name: value})
}

// SaveStates durably stores several state records. Each record is written
// whole; records that do not fit in one Badger transaction (thousands of
// device records after a busy flush interval) are saved in as many synced
// transactions as they need, so on an error some may already be saved.
func (b *Buffer) SaveStates(records map[string][]byte) error {
	if len(records) == 0 {
		return nil
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return ErrClosed
	}
	b.wmu.Lock()
	defer b.wmu.Unlock()
	names := make([]string, 0, len(records))
	for name := range records {
		names = append(names, name)
	}
	for len(names) > 0 {
		n, err := b.saveStates(names, records)
		if err != nil {
			return fmt.Errorf("saving %d state records: %w", len(records), err)
		}
		names = names[n:]
	}
	return nil
}

// saveStates saves the records of as many of names as fit in one synced
// transaction and returns how many it saved.
func (b *Buffer) saveStates(names []string, records map[string][]byte) (int, error) {
	var delta, added int64
	b.vlogSyncFailed.Store(false)
	if err := b.failure.failed(); err != nil {
		return 0, err
	}
	txn := b.db.NewTransaction(true)
	defer txn.Discard()
	n := 0
	for _, name := range names {
		k := stateKey(name)
		value := records[name]
		var old int64
		item, err := txn.Get(k)
		switch {
		case err == nil:
			old = recordSize(len(k), int(item.ValueSize()))
		case errors.Is(err, badger.ErrKeyNotFound):
		default:
			return 0, err
		}
		if err := txn.Set(k, value); errors.Is(err, badger.ErrTxnTooBig) && n > 0 {
			break // the rest go in the next transaction
		} else if err != nil {
			return 0, err
		}
		if old == 0 {
			added++
		}
		delta += recordSize(len(k), len(value)) - old
		n++
	}
	err := txn.Commit()
	if err != nil {
		b.failure.fail(err)
	}
	if err == nil && b.vlogSyncFailed.Swap(false) {
		err = errors.New("badger could not sync its value log")
	}
	if err == nil {
		err = b.dirSync.syncIfChanged()
	}
	if err != nil {
		return 0, err
	}
	b.usage.state.Add(delta)
	b.usage.stateRecords.Add(added)
	return n, nil
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
			if n, err := b.Collect(); err != nil {
				if errors.Is(err, ErrClosed) {
					return nil
				}
				b.logger.Error("collecting expired markers", "err", err)
			} else if n > 0 {
				b.logger.Debug("collected expired markers", "count", n)
			}
			if n, err := b.CollectHistory(); err != nil {
				if errors.Is(err, ErrClosed) {
					return nil
				}
				b.logger.Error("collecting expired history", "err", err)
			} else if n > 0 {
				b.logger.Debug("collected expired history", "count", n)
			}
		case <-vlog.C:
			b.mu.RLock()
			if !b.closed {
				for b.db.RunValueLogGC(0.5) == nil {
				}
			}
			b.mu.RUnlock()
		}
	}
}

// ballastInterval is how often Run checks free space for the ballast.
const ballastInterval = 5 * time.Second

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
			b.mu.RLock()
			defer b.mu.RUnlock()
			if b.closed {
				return 0, false, ErrClosed
			}
			b.wmu.Lock()
			defer b.wmu.Unlock()
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

// freeSpace reads the data directory's free bytes. It is called once per
// group commit: a statfs costs about a microsecond, far less than the
// group's fsync, and a cached value could let a burst overrun the
// watermark.
type freeSpace struct {
	dir      string
	override func() (uint64, bool)
}

func (f *freeSpace) bytes() (uint64, bool) {
	if f.override != nil {
		return f.override()
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(f.dir, &st); err != nil {
		return 0, false
	}
	return uint64(st.Bavail) * uint64(st.Bsize), true
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
