package buffer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/prometheus/client_golang/prometheus"
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
}

// Pending is a queued batch handed to the uplink.
type Pending struct {
	// Seq is the batch's position in the queue (arrival order).
	Seq        uint64
	BatchID    string
	HardwareID string
	ReceivedAt time.Time
	Payload    []byte
}

// Stats describes the queue at one instant.
type Stats struct {
	PendingBatches int64
	PendingBytes   int64
	// Oldest is the receive time of the oldest pending batch; zero when
	// nothing is pending.
	Oldest time.Time
}

// Options configure a Buffer. The zero value of a field means its default.
type Options struct {
	// MaxPendingBytes is the disk budget for undelivered batches, in bytes
	// of payload. New batches are refused with Full beyond it. Default 1 GiB.
	MaxPendingBytes int64 `yaml:"max_pending_bytes"`
	// MinFreeBytes is the free-space watermark of the data directory's
	// file system: below it new batches are refused with Full. Default 64 MiB.
	MinFreeBytes int64 `yaml:"min_free_bytes"`
	// Retention is how long a delivered batch's marker is kept to answer
	// "duplicate". Default 168h (7 days).
	Retention time.Duration `yaml:"retention"`
	// CollectInterval is how often expired markers are collected. Default 1m.
	CollectInterval time.Duration `yaml:"collect_interval"`
	// MaxGroupBatches caps how many batches one group commit takes. Default 1024.
	MaxGroupBatches int `yaml:"max_group_batches"`
	// MemTableSize is Badger's memtable size in bytes. Default 16 MiB,
	// sized for a 1 GB Raspberry Pi.
	MemTableSize int64 `yaml:"memtable_size"`
	// BlockCacheSize is Badger's block cache in bytes. Default 8 MiB.
	BlockCacheSize int64 `yaml:"block_cache_size"`

	// now replaces time.Now in tests.
	now func() time.Time
	// beforeCommit, when set, is called with each group transaction before
	// it commits; an error fails the group (tests inject disk failures).
	beforeCommit func() error
}

// DefaultOptions returns the defaults documented on Options.
func DefaultOptions() Options {
	return Options{
		MaxPendingBytes: 1 << 30,
		MinFreeBytes:    64 << 20,
		Retention:       7 * 24 * time.Hour,
		CollectInterval: time.Minute,
		MaxGroupBatches: 1024,
		MemTableSize:    16 << 20,
		BlockCacheSize:  8 << 20,
	}
}

// Validate reports the first invalid field.
func (o Options) Validate() error {
	switch {
	case o.MaxPendingBytes < 0:
		return errors.New("buffer.max_pending_bytes: must not be negative")
	case o.MinFreeBytes < 0:
		return errors.New("buffer.min_free_bytes: must not be negative")
	case o.Retention < 0:
		return errors.New("buffer.retention: must not be negative")
	case o.CollectInterval < 0:
		return errors.New("buffer.collect_interval: must not be negative")
	case o.MaxGroupBatches < 0:
		return errors.New("buffer.max_group_batches: must not be negative")
	case o.MemTableSize != 0 && o.MemTableSize < 1<<20:
		return errors.New("buffer.memtable_size: must be at least 1 MiB")
	case o.BlockCacheSize < 0:
		return errors.New("buffer.block_cache_size: must not be negative")
	}
	return nil
}

func (o Options) withDefaults() Options {
	d := DefaultOptions()
	if o.MaxPendingBytes == 0 {
		o.MaxPendingBytes = d.MaxPendingBytes
	}
	if o.MinFreeBytes == 0 {
		o.MinFreeBytes = d.MinFreeBytes
	}
	if o.Retention == 0 {
		o.Retention = d.Retention
	}
	if o.CollectInterval == 0 {
		o.CollectInterval = d.CollectInterval
	}
	if o.MaxGroupBatches == 0 {
		o.MaxGroupBatches = d.MaxGroupBatches
	}
	if o.MemTableSize == 0 {
		o.MemTableSize = d.MemTableSize
	}
	if o.BlockCacheSize == 0 {
		o.BlockCacheSize = d.BlockCacheSize
	}
	if o.now == nil {
		o.now = time.Now
	}
	return o
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

	// Owned by the committer goroutine.
	nextSeq uint64
	free    freeSpace

	pendingBatches atomic.Int64
	pendingBytes   atomic.Int64
}

// Open opens or creates the buffer in dir and starts its committer.
// reg may be nil.
func Open(dir string, opts Options, logger *slog.Logger, reg prometheus.Registerer) (*Buffer, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("component", "buffer")

	bopts := badger.DefaultOptions(dir).
		WithSyncWrites(true).
		WithDetectConflicts(false).
		WithMemTableSize(opts.MemTableSize).
		// Values must fit one transaction (15% of a memtable); larger
		// ones go to the value log, which is synced the same way.
		WithValueThreshold(min(1<<20, opts.MemTableSize/8)).
		WithNumMemtables(3).
		WithBlockCacheSize(opts.BlockCacheSize).
		WithValueLogFileSize(64 << 20).
		WithNumCompactors(2).
		WithLogger(badgerLogger{logger})
	db, err := badger.Open(bopts)
	if err != nil {
		return nil, fmt.Errorf("opening buffer %s: %w", dir, err)
	}
	b := &Buffer{
		dir:     dir,
		opts:    opts,
		db:      db,
		logger:  logger,
		reqs:    make(chan *commitReq, 4096),
		closing: make(chan struct{}),
		stopped: make(chan struct{}),
		notify:  make(chan struct{}, 1),
		free:    freeSpace{dir: dir},
	}
	if err := b.load(); err != nil {
		return nil, errors.Join(fmt.Errorf("loading buffer %s: %w", dir, err), db.Close())
	}
	b.metrics = newMetrics(reg, b)
	go b.committer()
	logger.Info("buffer open", "dir", dir, "pending_batches", b.pendingBatches.Load(),
		"pending_bytes", b.pendingBytes.Load())
	return b, nil
}

// load restores the queue counters and the next sequence number.
// Sequence numbers start at 1, so Pending(0, n) reads from the start.
func (b *Buffer) load() error {
	b.nextSeq = 1
	return b.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(seqKey)
		switch {
		case err == nil:
			if err := item.Value(func(v []byte) error {
				if len(v) != 8 {
					return fmt.Errorf("sequence record has %d bytes, want 8", len(v))
				}
				b.nextSeq = max(binary.BigEndian.Uint64(v), 1)
				return nil
			}); err != nil {
				return err
			}
		case !errors.Is(err, badger.ErrKeyNotFound):
			return err
		}
		it := txn.NewIterator(badger.IteratorOptions{Prefix: queuePrefix})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			seq, ok := parseQueueKey(item.Key())
			if !ok {
				return fmt.Errorf("malformed queue key %q", item.Key())
			}
			if seq >= b.nextSeq {
				b.nextSeq = seq + 1
			}
			b.pendingBatches.Add(1)
			b.pendingBytes.Add(item.ValueSize())
		}
		return nil
	})
}

// Commit durably stores entries and reports, per entry, what it did. It
// returns only after the batches it stored are synced to disk. An error
// means none of the entries may be acknowledged: the commit failed, or the
// buffer is closed.
func (b *Buffer) Commit(ctx context.Context, entries []Entry) ([]Outcome, error) {
	if len(entries) == 0 {
		return nil, nil
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
	if err := <-req.done; err != nil {
		return nil, err
	}
	return req.out, nil
}

// Notify returns a channel that receives a value after batches are stored.
func (b *Buffer) Notify() <-chan struct{} { return b.notify }

// Stats returns the current queue size and age.
func (b *Buffer) Stats() Stats {
	s := Stats{PendingBatches: b.pendingBatches.Load(), PendingBytes: b.pendingBytes.Load()}
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
		it.Rewind()
		if !it.Valid() {
			return nil
		}
		return it.Item().Value(func(v []byte) error {
			p, err := decodePending(0, v)
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
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return nil, ErrClosed
	}
	var out []Pending
	err := b.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: queuePrefix, PrefetchValues: true, PrefetchSize: min(limit, 100)})
		defer it.Close()
		for it.Seek(queueKey(after + 1)); it.Valid() && len(out) < limit; it.Next() {
			item := it.Item()
			seq, ok := parseQueueKey(item.Key())
			if !ok {
				return fmt.Errorf("malformed queue key %q", item.Key())
			}
			if err := item.Value(func(v []byte) error {
				p, err := decodePending(seq, v)
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
	if err != nil {
		return nil, fmt.Errorf("reading pending batches: %w", err)
	}
	return out, nil
}

// MarkDelivered removes delivered batches from the queue and keeps their
// markers for the retention window.
func (b *Buffer) MarkDelivered(batches []Pending) error {
	if len(batches) == 0 {
		return nil
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return ErrClosed
	}
	now := b.opts.now()
	var bytes int64
	wb := newTxnWriter(b.db)
	for _, p := range batches {
		m, err := b.marker(p.BatchID)
		if err != nil {
			wb.discard()
			return err
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
		bytes += int64(len(encodePending(p)))
	}
	if err := wb.commit(); err != nil {
		return fmt.Errorf("marking %d batches delivered: %w", len(batches), err)
	}
	b.pendingBatches.Add(-int64(len(batches)))
	b.pendingBytes.Add(-bytes)
	b.metrics.delivered.Add(float64(len(batches)))
	return nil
}

// DeadLetter moves a batch the cloud refuses permanently out of the queue
// into the dead-letter area, where it is kept (never deleted by the buffer)
// for an operator to inspect.
func (b *Buffer) DeadLetter(p Pending, reason string) error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return ErrClosed
	}
	m, err := b.marker(p.BatchID)
	if err != nil {
		return err
	}
	m.state = stateDead
	m.doneAt = b.opts.now()
	wb := newTxnWriter(b.db)
	if err := wb.set(markerKey(p.BatchID), m.encode()); err != nil {
		return err
	}
	if err := wb.set(deadKey(p.BatchID), encodePending(p)); err != nil {
		return err
	}
	if err := wb.delete(queueKey(p.Seq)); err != nil {
		return err
	}
	if err := wb.commit(); err != nil {
		return fmt.Errorf("dead-lettering batch %s: %w", p.BatchID, err)
	}
	b.pendingBatches.Add(-1)
	b.pendingBytes.Add(-int64(len(encodePending(p))))
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

// SaveState durably stores a small state record under name.
func (b *Buffer) SaveState(name string, value []byte) error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return ErrClosed
	}
	if err := b.db.Update(func(txn *badger.Txn) error {
		return txn.Set(stateKey(name), value)
	}); err != nil {
		return fmt.Errorf("saving state %s: %w", name, err)
	}
	return nil
}

// Run collects expired delivery markers and garbage-collects Badger's
// value log until ctx is done.
func (b *Buffer) Run(ctx context.Context) error {
	collect := time.NewTicker(b.opts.CollectInterval)
	defer collect.Stop()
	vlog := time.NewTicker(10 * time.Minute)
	defer vlog.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-collect.C:
			if n, err := b.Collect(); err != nil {
				if errors.Is(err, ErrClosed) {
					return nil
				}
				b.logger.Error("collecting expired markers", "err", err)
			} else if n > 0 {
				b.logger.Debug("collected expired markers", "count", n)
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

// Collect deletes the markers of batches delivered more than Retention ago
// and returns how many it deleted.
func (b *Buffer) Collect() (int, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return 0, ErrClosed
	}
	cutoff := b.opts.now().Add(-b.opts.Retention)
	end := expiryKey(cutoff, "")
	var keys [][]byte
	err := b.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: expiryPrefix})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().KeyCopy(nil)
			if string(k) >= string(end) {
				break
			}
			keys = append(keys, k)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("scanning expired markers: %w", err)
	}
	wb := newTxnWriter(b.db)
	for _, k := range keys {
		id := string(k[len(expiryPrefix)+8:])
		m, err := b.marker(id)
		if err == nil && m.state == stateDelivered {
			if err := wb.delete(markerKey(id)); err != nil {
				return 0, err
			}
		}
		if err := wb.delete(k); err != nil {
			return 0, err
		}
	}
	if err := wb.commit(); err != nil {
		return 0, fmt.Errorf("deleting expired markers: %w", err)
	}
	b.metrics.collected.Add(float64(len(keys)))
	return len(keys), nil
}

// Close stops accepting commits, finishes the commits already queued and
// closes the database. It is idempotent.
func (b *Buffer) Close() error {
	b.closeOnce.Do(func() {
		b.mu.Lock()
		b.closed = true
		close(b.closing)
		b.mu.Unlock()
		<-b.stopped
		b.closeErr = b.db.Close()
		if b.closeErr != nil {
			b.closeErr = fmt.Errorf("closing buffer %s: %w", b.dir, b.closeErr)
		}
	})
	return b.closeErr
}
