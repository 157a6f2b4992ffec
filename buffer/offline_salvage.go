package buffer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dgraph-io/badger/v4/options"
	"github.com/dgraph-io/badger/v4/table"
	"github.com/dgraph-io/badger/v4/y"
)

// Badger's entry flags (value.go) that salvage reads.
const (
	badgerBitDelete       = 1 << 0
	badgerBitValuePointer = 1 << 1
)

// badgerInternalPrefix starts Badger's own keys (the transaction marker,
// banned namespaces): never the buffer's.
var badgerInternalPrefix = []byte("!badger!")

// SkippedPart is a part of a damaged directory salvage could not read.
type SkippedPart struct {
	// File is the file's name in the directory.
	File string `json:"file"`
	// Block is the table's data block that failed its checksum (-1: the
	// whole file, or a part of a write-ahead log).
	Block int `json:"block"`
	// Offset and Bytes are the unreadable range of a write-ahead log.
	Offset int `json:"offset,omitempty"`
	Bytes  int `json:"bytes,omitempty"`
	// Reason says why it was skipped.
	Reason string `json:"reason"`
}

// SalvageReport is what Salvage read and wrote.
type SalvageReport struct {
	Dir string `json:"dir"`
	Out string `json:"out"`
	// Tables and Logs are the .sst and .mem files read (in part or whole);
	// Blocks the tables' data blocks read.
	Tables int `json:"tables"`
	Logs   int `json:"logs"`
	Blocks int `json:"blocks"`
	// PendingBatches are the pending batches written to Out, DeadLetters
	// its dead letters and StateRecords its state records (the API key
	// cache, the device registry).
	PendingBatches int `json:"pending_batches"`
	DeadLetters    int `json:"dead_letters"`
	StateRecords   int `json:"state_records"`
	// DeliveredSkipped counts queue entries left out because the batch's
	// marker says it was delivered or dead-lettered since; Duplicates,
	// queue entries of a batch_id already taken from a newer one.
	DeliveredSkipped int `json:"delivered_skipped"`
	Duplicates       int `json:"duplicates"`
	// LostBatches are batches whose marker says pending but whose queue
	// entry was in a part that could not be read (LostCount in all; the
	// list is capped at 1000). Batches known by neither are not counted:
	// nothing readable names them.
	LostBatches []string `json:"lost_batches"`
	LostCount   int      `json:"lost_count"`
	// Skipped are the parts of the directory that were not read.
	Skipped []SkippedPart `json:"skipped"`
}

// salvaged is the newest readable version of one key.
type salvaged struct {
	version uint64
	deleted bool
	value   []byte
	// from names where it was read: "FILE block N" or "FILE offset N"
	// (where its entry starts), every place that holds this version.
	from []string
}

// salvageReader collects the newest version of every key it reads, from
// any file, as Badger resolves versions: the highest version wins, a
// deletion included.
type salvageReader struct {
	dir    string // where value log files are read
	vlogs  map[uint32]openLog
	keys   map[string]salvaged
	report *SalvageReport
}

// wanted reports whether salvage keeps a key: the queue, markers, dead
// letters, state and the sequence number. History records and the
// collection indexes are not carried over.
func wanted(key []byte) bool {
	for _, p := range [][]byte{queuePrefix, markerPrefix, deadPrefix, statePrefix, seqKey} {
		if bytes.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

func (r *salvageReader) add(keyTs []byte, meta byte, value []byte, file, from string) {
	if len(keyTs) <= 8 {
		return
	}
	key, version := y.ParseKey(keyTs), y.ParseTs(keyTs)
	if bytes.HasPrefix(key, badgerInternalPrefix) || !wanted(key) {
		return
	}
	cur, ok := r.keys[string(key)]
	if ok && cur.version == version {
		cur.from = append(cur.from, from)
		r.keys[string(key)] = cur
		return
	}
	if ok && cur.version > version {
		return
	}
	if meta&badgerBitValuePointer != 0 && meta&badgerBitDelete == 0 {
		// A value in the value log (a batch over ValueThreshold, memtable/8).
		v, err := r.valueFromLog(keyTs, value)
		if err != nil {
			r.report.Skipped = append(r.report.Skipped, SkippedPart{File: file, Block: -1,
				Reason: fmt.Sprintf("the value of key %q in the value log: %v", key, err)})
			return
		}
		value = v
	}
	r.keys[string(key)] = salvaged{version: version, deleted: meta&badgerBitDelete != 0, value: bytes.Clone(value), from: []string{from}}
}

// valueFromLog reads the value a record points to in the value log:
// Badger's value pointer is the file id, the entry's length and its offset,
// three uint32s in the machine's byte order, and the entry has the
// write-ahead log's format, checksum included.
func (r *salvageReader) valueFromLog(keyTs, ptr []byte) ([]byte, error) {
	if len(ptr) < 12 {
		return nil, errors.New("its value pointer is short")
	}
	fid, length, off := binary.NativeEndian.Uint32(ptr), binary.NativeEndian.Uint32(ptr[4:]), binary.NativeEndian.Uint32(ptr[8:])
	name := fmt.Sprintf("%06d.vlog", fid)
	f, err := r.valueLog(fid, name)
	if err != nil {
		return nil, err
	}
	if int64(off)+int64(length) > f.size {
		return nil, fmt.Errorf("%s: offset %d and length %d lie beyond its end", name, off, length)
	}
	buf := make([]byte, length)
	if _, err := f.ReadAt(buf, int64(off)); err != nil {
		return nil, fmt.Errorf("%s offset %d: %w", name, off, err)
	}
	e, st := readWALEntry(buf, 0)
	if st != walOK || !bytes.Equal(e.key, keyTs) {
		return nil, fmt.Errorf("%s offset %d: the entry is damaged or another key's", name, off)
	}
	return e.value, nil
}

// openLog is a value log file salvage reads, open until the read is done.
type openLog struct {
	*os.File
	size int64
}

// valueLog returns the value log file fid, opened at its first use; a
// file that cannot be opened is tried once.
func (r *salvageReader) valueLog(fid uint32, name string) (openLog, error) {
	if f, ok := r.vlogs[fid]; ok {
		if f.File == nil {
			return f, fmt.Errorf("%s cannot be read", name)
		}
		return f, nil
	}
	if r.vlogs == nil {
		r.vlogs = map[uint32]openLog{}
	}
	f, err := os.Open(filepath.Join(r.dir, name))
	if err != nil {
		r.vlogs[fid] = openLog{}
		return openLog{}, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		r.vlogs[fid] = openLog{}
		return openLog{}, err
	}
	r.vlogs[fid] = openLog{File: f, size: fi.Size()}
	return r.vlogs[fid], nil
}

// closeLogs closes the value log files read.
func (r *salvageReader) closeLogs() {
	for _, f := range r.vlogs {
		if f.File != nil {
			f.Close()
		}
	}
}

// Salvage reads every readable record of the buffer in dir, damaged or
// not, and writes the pending batches, dead letters and state records it
// finds into a new buffer in out (which must not exist or be empty), that
// Open accepts. dir is only read: tables and write-ahead logs are found by
// name (the MANIFEST is not needed), tables are read block by block with
// each block's checksum verified, so a damaged block costs only its
// records, and a write-ahead log is read transaction by transaction up to
// damage and again from the next checksummed entry after it. Of each key
// the newest readable version wins, as in Badger: a batch delivered since
// it was queued stays out if its queue entry's deletion or its marker was
// read. The queue keeps its order (receive times kept, new sequence
// numbers). Delivered markers and history records are not carried over.
func Salvage(ctx context.Context, dir, out string, logger *slog.Logger) (SalvageReport, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	rep := SalvageReport{Dir: dir, Out: out, LostBatches: []string{}, Skipped: []SkippedPart{}}
	if abs, err := filepath.Abs(dir); err == nil {
		if o, err := filepath.Abs(out); err == nil && o == abs {
			return rep, errors.New("salvage: --out must be a new directory, not the damaged one")
		}
	}
	if err := checkNotInUse(dir); err != nil {
		return rep, err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return rep, fmt.Errorf("salvage: %w", err)
	}
	if err := requireEmptyDir(out); err != nil {
		return rep, err
	}
	tables, mems := listBadgerFiles(entries)
	if len(tables) == 0 && len(mems) == 0 {
		return rep, fmt.Errorf("salvage: no buffer at %s (no table or write-ahead log files): check --data-dir", dir)
	}
	r := &salvageReader{dir: dir, keys: map[string]salvaged{}, report: &rep}
	defer r.closeLogs()
	// A MANIFEST that can be read tells each table's compression and
	// which tables were compacted away (their records are older versions
	// of what newer tables hold).
	listed, deleted, merr := readManifest(filepath.Join(dir, manifestName))
	if merr != nil {
		rep.Skipped = append(rep.Skipped, SkippedPart{File: manifestName, Block: -1, Reason: merr.Error()})
		listed, deleted = nil, nil
	}
	for _, id := range slices.Sorted(maps.Keys(tables)) {
		if deleted[id] {
			continue
		}
		compression := defaultCompressed
		if t, ok := listed[id]; ok {
			compression = options.CompressionType(t.Compression)
		}
		r.readTable(filepath.Join(dir, tables[id]), compression)
	}
	for _, name := range mems {
		if err := r.readLog(filepath.Join(dir, name)); err != nil {
			return rep, err
		}
	}
	w, err := r.plan()
	if err != nil {
		return rep, err
	}
	if err := w.write(ctx, out, logger); err != nil {
		return rep, err
	}
	for _, b := range w.pending {
		if b.dead {
			rep.DeadLetters++
		} else {
			rep.PendingBatches++
		}
	}
	rep.StateRecords = len(w.states)
	return rep, nil
}

// requireEmptyDir fails unless dir does not exist or is an empty directory.
func requireEmptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("salvage: --out: %w", err)
	}
	if len(entries) > 0 {
		return fmt.Errorf("salvage: --out %s is not empty: give a new directory", dir)
	}
	return nil
}

// readTable reads a table block by block through Badger's table reader,
// which verifies each block's checksum as it reads it. A table whose index
// cannot be read (cut short, or damaged there) is skipped whole: without
// the index its blocks cannot be found.
func (r *salvageReader) readTable(path string, compression options.CompressionType) {
	name := filepath.Base(path)
	skip := func(block int, reason string) {
		r.report.Skipped = append(r.report.Skipped, SkippedPart{File: name, Block: block, Reason: reason})
	}
	opened := false
	err := withTable(path, compression, options.OnBlockRead, func(t *table.Table) error {
		opened = true
		r.readBlocks(t, name, skip)
		return nil
	})
	switch {
	case err != nil && !opened:
		skip(-1, fmt.Sprintf("its index cannot be read, so none of its blocks can be found: %v", err))
	case err != nil:
		skip(-1, fmt.Sprintf("reading stopped: %v", err))
	}
}

// readBlocks reads every block of t that passes its checksum.
func (r *salvageReader) readBlocks(t *table.Table, name string, skip func(block int, reason string)) {
	r.report.Tables++
	// The first key of every block, from the index.
	firsts := t.KeySplits(math.MaxInt32, nil)
	it := t.NewIterator(table.NOCACHE)
	defer it.Close()
	for i, first := range firsts {
		it.Seek([]byte(first))
		if !it.Valid() {
			skip(i, "the block fails its checksum (or cannot be decompressed)")
			continue
		}
		r.report.Blocks++
		for ; it.Valid(); it.Next() {
			if i+1 < len(firsts) && y.CompareKeys(it.Key(), []byte(firsts[i+1])) >= 0 {
				break
			}
			vs := it.Value()
			r.add(it.Key(), vs.Meta, vs.Value, name, fmt.Sprintf("%s block %d", name, i))
		}
	}
}

// readLog reads a write-ahead log's committed transactions. At damage it
// drops the transaction it was reading and goes on from the next entry
// that passes its checksum; a torn tail (scanWAL) is not damage.
func (r *salvageReader) readLog(path string) error {
	name := filepath.Base(path)
	s, err := scanWAL(path)
	if err != nil {
		r.report.Skipped = append(r.report.Skipped, SkippedPart{File: name, Block: -1, Reason: err.Error()})
		return nil
	}
	data, err := readWAL(path)
	if err != nil {
		r.report.Skipped = append(r.report.Skipped, SkippedPart{File: name, Block: -1, Reason: err.Error()})
		return nil
	}
	r.report.Logs++
	if len(data) < walHeaderSize {
		r.report.Skipped = append(r.report.Skipped, SkippedPart{File: name, Block: -1, Reason: s.problem})
		return nil
	}
	end := len(data)
	if s.problem == "" {
		end = s.validEnd // healthy: the torn tail, if any, was never acknowledged
	}
	// Every entry that passes its checksum is taken, whether or not its
	// transaction's closing entry can be read: a transaction followed by
	// later ones was committed (Badger writes them one after the other),
	// and one at the end that was not is a batch its device was never
	// told is stored, which it resends and is answered "duplicate".
	for off := walHeaderSize; off < end; {
		e, st := readWALEntry(data[:end], off)
		if st == walEOF && bytes.IndexFunc(data[off:end], func(r rune) bool { return r != 0 }) < 0 {
			break // zeros: the end of what was written
		}
		if st != walOK {
			next := nextWALEntry(data[:end], off+1)
			if next < 0 {
				if nz := bytes.LastIndexFunc(data[off:end], func(r rune) bool { return r != 0 }); nz >= 0 {
					r.report.Skipped = append(r.report.Skipped, SkippedPart{File: name, Block: -1,
						Offset: off, Bytes: nz + 1, Reason: "unreadable entries up to the end of what was written"})
				}
				break
			}
			r.report.Skipped = append(r.report.Skipped, SkippedPart{File: name, Block: -1,
				Offset: off, Bytes: next - off, Reason: "unreadable entries"})
			off = next
			continue
		}
		if e.meta&walBitFinTxn == 0 {
			r.add(e.key, e.meta&^walBitTxn, e.value, name, fmt.Sprintf("%s offset %d", name, off))
		}
		off += e.size
	}
	return nil
}

// nextWALEntry is the offset of the first entry from offset from on that
// passes its checksum (-1: none).
func nextWALEntry(data []byte, from int) int {
	for p := from; p < len(data); p++ {
		if _, st := readWALEntry(data, p); st == walOK {
			return p
		}
	}
	return -1
}

// salvageWrite is what salvage writes into the new buffer.
type salvageWrite struct {
	pending []salvageBatch
	states  map[string][]byte
}

type salvageBatch struct {
	seq    uint64
	p      Pending
	hash   [32]byte
	dead   bool
	reason string
}

// plan decides, from the newest version of every key, which batches go
// into the new buffer: every live queue entry (one per batch_id, the one
// its marker names, else the newest), unless the batch's marker says it
// was delivered or dead-lettered since, and every live dead letter.
func (r *salvageReader) plan() (*salvageWrite, error) {
	rep := r.report
	markers := map[string]marker{}
	for k, v := range r.keys {
		if v.deleted || !strings.HasPrefix(k, string(markerPrefix)) {
			continue
		}
		if m, err := decodeMarker(v.value); err == nil {
			markers[strings.TrimPrefix(k, string(markerPrefix))] = m
		}
	}
	w := &salvageWrite{states: map[string][]byte{}}
	byID := map[string]int{}
	take := func(b salvageBatch) {
		if i, ok := byID[b.p.BatchID]; ok {
			rep.Duplicates++
			old := w.pending[i]
			m, found := markers[b.p.BatchID]
			// Keep the entry the marker names; else a dead letter over a
			// queue entry (the later state); else the newer queue entry.
			keepNew := (found && m.seq == b.seq && !b.dead) ||
				(!(found && m.seq == old.seq && !old.dead) && (b.dead || (!old.dead && b.seq > old.seq)))
			if keepNew {
				w.pending[i] = b
			}
			return
		}
		byID[b.p.BatchID] = len(w.pending)
		w.pending = append(w.pending, b)
	}
	for k, v := range r.keys {
		if v.deleted {
			continue
		}
		key := []byte(k)
		switch {
		case bytes.HasPrefix(key, queuePrefix):
			seq, ok := parseQueueKey(key)
			if !ok {
				continue
			}
			p, err := decodePending(seq, v.value)
			if err != nil || len(p.Payload) == 0 {
				rep.Skipped = append(rep.Skipped, SkippedPart{Block: -1,
					Reason: fmt.Sprintf("queue entry %d cannot be decoded: %v", seq, err)})
				continue
			}
			if m, found := markers[p.BatchID]; found && m.state != statePending {
				rep.DeliveredSkipped++
				continue
			}
			take(salvageBatch{seq: seq, p: p})
		case bytes.HasPrefix(key, deadPrefix):
			p, reason, err := decodeDead(v.value, true)
			if err != nil {
				rep.Skipped = append(rep.Skipped, SkippedPart{Block: -1,
					Reason: fmt.Sprintf("dead letter %q cannot be decoded: %v", key, err)})
				continue
			}
			if m, found := markers[p.BatchID]; found && m.state == statePending {
				continue // re-forwarded since: its queue entry holds it
			}
			take(salvageBatch{seq: math.MaxUint64, p: p, dead: true, reason: reason})
		case bytes.HasPrefix(key, statePrefix):
			w.states[strings.TrimPrefix(k, string(statePrefix))] = v.value
		}
	}
	// Queue order: receive order, dead letters after.
	slices.SortFunc(w.pending, func(a, b salvageBatch) int {
		if a.seq != b.seq {
			if a.seq < b.seq {
				return -1
			}
			return 1
		}
		return strings.Compare(a.p.BatchID, b.p.BatchID)
	})
	for i := range w.pending {
		b := &w.pending[i]
		if m, found := markers[b.p.BatchID]; found {
			b.hash = m.hash
		} else {
			// The device's identity hash is lost with the marker: a resend
			// of this batch_id will be answered as a conflict, not a
			// duplicate, and is not stored twice either way.
			b.hash = sha256.Sum256(b.p.Payload)
		}
	}
	seen := map[string]bool{}
	for id, m := range markers {
		if m.state == statePending {
			if _, ok := byID[id]; !ok && !seen[id] {
				seen[id] = true
				rep.LostCount++
				if len(rep.LostBatches) < 1000 {
					rep.LostBatches = append(rep.LostBatches, id)
				}
			}
		}
	}
	slices.Sort(rep.LostBatches)
	return w, nil
}

// write creates the new buffer in out through Open, so that it is what
// gatewayd writes: the batches committed in queue order (in groups), the
// dead letters dead-lettered again, the state records saved.
func (w *salvageWrite) write(ctx context.Context, out string, logger *slog.Logger) (err error) {
	if err := os.MkdirAll(out, 0o700); err != nil {
		return fmt.Errorf("salvage: %w", err)
	}
	// Everything salvaged was acknowledged once: no budget, share or rate
	// of a device applies to putting it back.
	b, err := Open(out, Options{MaxPendingBytes: math.MaxInt64 / 2, DeviceShare: 1, KeyShare: 1, DeviceBatchRate: -1},
		logger, nil)
	if err != nil {
		return fmt.Errorf("salvage: creating the new buffer: %w", err)
	}
	defer func() {
		if cerr := b.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("salvage: closing the new buffer: %w", cerr)
		}
	}()
	const group = 256
	for i := 0; i < len(w.pending); i += group {
		var entries []Entry
		for _, sb := range w.pending[i:min(i+group, len(w.pending))] {
			entries = append(entries, Entry{BatchID: sb.p.BatchID, HardwareID: sb.p.HardwareID, Hash: sb.hash,
				Payload: sb.p.Payload, ReceivedAt: sb.p.ReceivedAt})
		}
		outcomes, err := b.Commit(ctx, entries)
		if err != nil {
			return fmt.Errorf("salvage: writing batches: %w", err)
		}
		for j, o := range outcomes {
			if o != Stored {
				return fmt.Errorf("salvage: batch %s was not stored: %v", entries[j].BatchID, o)
			}
		}
	}
	reasons := map[string]string{}
	for _, sb := range w.pending {
		if sb.dead {
			reasons[sb.p.BatchID] = sb.reason
		}
	}
	if len(reasons) > 0 {
		queued, err := b.Pending(0, len(w.pending))
		if err != nil {
			return fmt.Errorf("salvage: %w", err)
		}
		for _, p := range queued {
			if reason, ok := reasons[p.BatchID]; ok {
				if err := b.DeadLetter(p, reason); err != nil {
					return fmt.Errorf("salvage: dead-lettering %s again: %w", p.BatchID, err)
				}
			}
		}
	}
	if len(w.states) > 0 {
		if err := b.SaveStates(w.states); err != nil {
			return fmt.Errorf("salvage: writing state records: %w", err)
		}
	}
	return nil
}
