package buffer

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
)

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
