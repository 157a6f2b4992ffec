package buffer

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// Snapshot is a read-only view of a stopped gateway's buffer, for
// inspection and export (gatewayctl). It runs the checks Open runs.
type Snapshot struct {
	dir string
	db  *badger.DB
	// Note says how the snapshot was opened when it had to write: after a
	// crash, Badger must truncate the torn tail of its write-ahead log
	// before it can read, as gatewayd does at its next start.
	Note string
}

// OpenSnapshot opens the buffer in dir for reading. It fails with an
// *InUseError (errors.Is ErrInUse) while a gatewayd holds the directory,
// with a *DamagedError when Open would refuse the directory, and when dir
// holds no buffer.
//
// After a clean shutdown it opens Badger read-only, which leaves the
// directory untouched. Badger cannot open write-ahead logs read-only (it
// must truncate their unwritten tails; a clean close leaves none): after a
// crash or kill the snapshot opens it read-write, which replays and
// truncates them exactly as gatewayd's next start would, after the same
// checks proved any torn tail harmless, and says so in Note.
func OpenSnapshot(dir string, logger *slog.Logger) (*Snapshot, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("component", "buffer")
	if _, err := os.Stat(filepath.Join(dir, manifestName)); errors.Is(err, fs.ErrNotExist) {
		// Without a MANIFEST, tables or write-ahead logs are a damaged
		// buffer (checkDirectory says so, as gatewayd does), not none.
		entries, _ := os.ReadDir(dir)
		if tables, mems := listBadgerFiles(entries); len(tables) == 0 && len(mems) == 0 {
			return nil, fmt.Errorf("no buffer at %s (no %s file): check the data directory", dir, manifestName)
		}
	} else if err != nil {
		return nil, fmt.Errorf("opening buffer %s: %w", dir, err)
	}
	if err := checkNotInUse(dir); err != nil {
		return nil, err
	}
	if err := checkDirectory(dir, logger); err != nil {
		return nil, err
	}
	clean, err := readCleanRecord(dir)
	if err != nil {
		logger.Warn("ignoring the clean-shutdown record", "err", err)
	}
	mems, memSize := memFiles(dir)
	opts := Options{MemTableSize: memSize}.withDefaults()
	bo := badgerOptions(dir, opts, badgerLogger{l: logger})
	s := &Snapshot{dir: dir}
	// A clean close leaves no write-ahead log; read-only Badger cannot
	// open one (it would have to truncate it: ErrTruncateNeeded, and its
	// failed Open leaks a goroutine), so predict it instead of trying.
	if mems == 0 {
		s.db, err = badger.Open(bo.WithReadOnly(true))
	} else {
		s.Note = "gatewayd did not stop cleanly; the torn tail of its write-ahead log was truncated, " +
			"as its next start would have done"
		s.db, err = badger.Open(bo)
	}
	if err != nil {
		return nil, openError(dir, err)
	}
	scan, err := scanDB(s.db)
	if err != nil {
		return nil, errors.Join(damaged(dir, "reading its records: %v", err), s.db.Close())
	}
	if clean != nil {
		got := cleanRecord{Seq: scan.nextSeq, PendingBatches: scan.pendingBatches,
			DeliveredMarkers: scan.usage.DeliveredMarkers, DeadBatches: scan.usage.DeadBatches,
			StateRecords: scan.stateRecords, HistoryBatches: scan.usage.HistoryBatches}
		if err := clean.matches(got); err != nil {
			return nil, errors.Join(damaged(dir, "%v", err), s.db.Close())
		}
	}
	return s, nil
}

// MemTableSizeOf returns the memtable size (buffer.memtable_size) the
// write-ahead logs in dir were created with, at least the default: Badger
// creates each .mem file at twice the memtable size, and replaying one into
// a smaller memtable fails. Tools opening a gateway's directory without its
// configuration use it.
func MemTableSizeOf(dir string) int64 {
	_, size := memFiles(dir)
	return size
}

// memFiles returns how many write-ahead logs dir holds and the memtable
// size they were created with (at least the default).
func memFiles(dir string) (int, int64) {
	n, size := 0, DefaultOptions().MemTableSize
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if filepath.Ext(e.Name()) != ".mem" {
			continue
		}
		n++
		if fi, err := e.Info(); err == nil {
			size = max(size, min(fi.Size()/2, 1<<30))
		}
	}
	return n, size
}

// Close closes the snapshot.
func (s *Snapshot) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("closing buffer %s: %w", s.dir, err)
	}
	return nil
}

// DeadLetters returns up to limit dead letters (all with limit <= 0), by
// batch_id, and how many there are in all.
func (s *Snapshot) DeadLetters(limit int) ([]DeadLetter, int, error) {
	return deadLetters(s.db, limit)
}

// DeviceCount is one device's share of the queue.
type DeviceCount struct {
	HardwareID string `json:"hardware_id"`
	Batches    int64  `json:"batches"`
	Bytes      int64  `json:"bytes"`
}

// StateRecord is one state record's name and size.
type StateRecord struct {
	Name  string `json:"name"`
	Bytes int    `json:"bytes"`
}

// Inspection is what a buffer holds, for operators.
type Inspection struct {
	Dir string `json:"dir"`
	// CleanShutdown is whether gatewayd was stopped cleanly.
	CleanShutdown  bool      `json:"clean_shutdown"`
	PendingBatches int64     `json:"pending_batches"`
	PendingBytes   int64     `json:"pending_bytes"`
	OldestPending  time.Time `json:"oldest_pending,omitzero"`
	NewestPending  time.Time `json:"newest_pending,omitzero"`
	// Devices are the devices with the most pending batches (at most the
	// top asked for), most first; DeviceCount is how many devices have
	// pending batches.
	Devices          []DeviceCount `json:"devices"`
	DeviceCount      int           `json:"device_count"`
	DeliveredMarkers int64         `json:"delivered_markers"`
	// OldestDelivery is the oldest kept delivered marker's delivery time.
	OldestDelivery time.Time     `json:"oldest_delivery,omitzero"`
	DeadLetters    []DeadLetter  `json:"dead_letters"`
	DeadBatches    int64         `json:"dead_batches"`
	StateRecords   []StateRecord `json:"state_records"`
	NextSeq        uint64        `json:"next_seq"`
	// Usage is what buffer.max_pending_bytes counts, by kind.
	Usage Usage `json:"usage"`
	// Files is the bytes of the directory's files by kind: "tables" (.sst),
	// "value_log" (.vlog), "write_ahead_log" (.mem), "other".
	Files map[string]int64 `json:"files"`
}

// Inspect reads every record and summarizes them; top bounds the devices
// listed (all with top <= 0), deadLimit the dead letters listed.
func (s *Snapshot) Inspect(top, deadLimit int) (Inspection, error) {
	in := Inspection{Dir: s.dir, Files: map[string]int64{}}
	scan, err := scanDB(s.db)
	if err != nil {
		return in, fmt.Errorf("reading the buffer: %w", err)
	}
	in.PendingBatches, in.PendingBytes, in.NextSeq = scan.pendingBatches, scan.pendingBytes, scan.nextSeq
	in.Usage = scan.usage
	in.DeliveredMarkers, in.DeadBatches = scan.usage.DeliveredMarkers, scan.usage.DeadBatches
	_, err = os.Stat(filepath.Join(s.dir, cleanRecordName))
	in.CleanShutdown = err == nil

	devices := map[string]*DeviceCount{}
	err = s.db.View(func(txn *badger.Txn) error {
		if err := summarizeQueue(txn, &in, devices); err != nil {
			return err
		}
		in.OldestDelivery = oldestDelivery(txn)
		in.StateRecords = stateRecords(txn)
		return nil
	})
	if err != nil {
		return in, fmt.Errorf("reading the buffer: %w", err)
	}
	in.Devices, in.DeviceCount = topDevices(devices, top)
	if in.DeadLetters, _, err = deadLetters(s.db, deadLimit); err != nil {
		return in, err
	}
	return in, addFileBytes(s.dir, in.Files)
}

// summarizeQueue reads every queue entry's header: the oldest and newest
// pending batch go to in, the batches and bytes of each device to
// devices.
func summarizeQueue(txn *badger.Txn, in *Inspection, devices map[string]*DeviceCount) error {
	it := txn.NewIterator(badger.IteratorOptions{Prefix: queuePrefix, PrefetchValues: true, PrefetchSize: 16})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		if err := it.Item().Value(func(v []byte) error {
			p, err := decodePendingHeader(0, v)
			if err != nil {
				return fmt.Errorf("queue entry %q: %w", it.Item().Key(), err)
			}
			if in.OldestPending.IsZero() || p.ReceivedAt.Before(in.OldestPending) {
				in.OldestPending = p.ReceivedAt
			}
			if p.ReceivedAt.After(in.NewestPending) {
				in.NewestPending = p.ReceivedAt
			}
			d := devices[p.HardwareID]
			if d == nil {
				d = &DeviceCount{HardwareID: p.HardwareID}
				devices[p.HardwareID] = d
			}
			d.Batches++
			d.Bytes += int64(len(v))
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// oldestDelivery is the delivery time of the oldest kept delivered
// marker, from the first collection index entry (zero: none).
func oldestDelivery(txn *badger.Txn) time.Time {
	it := txn.NewIterator(badger.IteratorOptions{Prefix: expiryPrefix})
	defer it.Close()
	if it.Rewind(); it.Valid() {
		k := it.Item().Key()
		if len(k) >= len(expiryPrefix)+8 {
			return time.UnixMilli(int64(binary.BigEndian.Uint64(k[len(expiryPrefix):])))
		}
	}
	return time.Time{}
}

// stateRecords lists the state records and their sizes.
func stateRecords(txn *badger.Txn) []StateRecord {
	var out []StateRecord
	it := txn.NewIterator(badger.IteratorOptions{Prefix: statePrefix})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		out = append(out, StateRecord{
			Name: string(it.Item().Key()[len(statePrefix):]), Bytes: int(it.Item().ValueSize())})
	}
	return out
}

// topDevices returns the devices with the most pending batches, most
// first (then by hardware_id), at most top of them (all with top <= 0),
// and how many devices there are.
func topDevices(devices map[string]*DeviceCount, top int) ([]DeviceCount, int) {
	var out []DeviceCount
	for _, d := range devices {
		out = append(out, *d)
	}
	slices.SortFunc(out, func(a, b DeviceCount) int {
		return cmp.Or(cmp.Compare(b.Batches, a.Batches), strings.Compare(a.HardwareID, b.HardwareID))
	})
	n := len(out)
	if top > 0 && len(out) > top {
		out = out[:top]
	}
	return out, n
}

// addFileBytes adds the bytes of dir's regular files to files by kind:
// "tables" (.sst), "value_log" (.vlog), "write_ahead_log" (.mem), "other".
func addFileBytes(dir string, files map[string]int64) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("listing %s: %w", dir, err)
	}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		kind := "other"
		switch filepath.Ext(e.Name()) {
		case ".sst":
			kind = "tables"
		case ".vlog":
			kind = "value_log"
		case ".mem":
			kind = "write_ahead_log"
		}
		files[kind] += fileBytes(fi)
	}
	return nil
}

// Batch states of Batch.State and of the what argument of Batches.
const (
	StatePending = "pending"
	StateDead    = "dead"
	StateAll     = "all"
)

// Batch is a stored batch with its payload.
type Batch struct {
	State string
	// Seq is the queue position of a pending batch.
	Seq            uint64
	BatchID        string
	HardwareID     string
	ReceivedAt     time.Time
	DeadLetteredAt time.Time
	Reason         string
	Payload        []byte
}

// Batches calls fn for every batch of the kind what (StatePending, in
// queue order; StateDead, by batch_id; or StateAll, pending first),
// of hardwareID's device if not empty. It reads one batch at a time: the
// Batch and its Payload are valid only during the call.
func (s *Snapshot) Batches(what, hardwareID string, fn func(Batch) error) error {
	if what != StatePending && what != StateDead && what != StateAll {
		return fmt.Errorf("%q is not one of %s, %s, %s", what, StatePending, StateDead, StateAll)
	}
	return s.db.View(func(txn *badger.Txn) error {
		if what != StateDead {
			it := txn.NewIterator(badger.IteratorOptions{Prefix: queuePrefix, PrefetchValues: false})
			defer it.Close()
			for it.Rewind(); it.Valid(); it.Next() {
				seq, ok := parseQueueKey(it.Item().Key())
				if !ok {
					return fmt.Errorf("malformed queue key %q", it.Item().Key())
				}
				if err := it.Item().Value(func(v []byte) error {
					p, err := decodePendingHeader(seq, v)
					if err != nil {
						return fmt.Errorf("queue entry %d: %w", seq, err)
					}
					if hardwareID != "" && p.HardwareID != hardwareID {
						return nil
					}
					return fn(Batch{State: StatePending, Seq: seq, BatchID: p.BatchID, HardwareID: p.HardwareID,
						ReceivedAt: p.ReceivedAt, Payload: v[pendingHeaderLen(p):]})
				}); err != nil {
					return err
				}
			}
		}
		if what == StatePending {
			return nil
		}
		it := txn.NewIterator(badger.IteratorOptions{Prefix: deadPrefix, PrefetchValues: false})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			var b Batch
			if err := it.Item().Value(func(v []byte) error {
				p, reason, err := decodeDead(v, false)
				if err != nil {
					return fmt.Errorf("dead letter %q: %w", it.Item().Key(), err)
				}
				b = Batch{State: StateDead, BatchID: p.BatchID, HardwareID: p.HardwareID,
					ReceivedAt: p.ReceivedAt, Reason: reason,
					Payload: bytes.Clone(v[pendingHeaderLen(p)+deadReasonLen(v, p):])}
				return nil
			}); err != nil {
				return err
			}
			if hardwareID != "" && b.HardwareID != hardwareID {
				continue
			}
			if m, found, err := markerIn(txn, b.BatchID); err != nil {
				return err
			} else if found {
				b.DeadLetteredAt = m.doneAt
			}
			if err := fn(b); err != nil {
				return err
			}
		}
		return nil
	})
}

// fileBytes is the disk space a file takes: Badger's logs are sparse files
// created at their full size.
func fileBytes(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}
