package buffer

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/dgraph-io/badger/v4/options"
	"github.com/dgraph-io/badger/v4/pb"
	"github.com/dgraph-io/badger/v4/table"
	"github.com/dgraph-io/ristretto/v2/z"
	"google.golang.org/protobuf/proto"
)

// ErrDamaged matches (errors.Is) every *DamagedError.
var ErrDamaged = errors.New("buffer: damaged")

// DamagedError reports a buffer directory that cannot be opened without
// losing data. Its message says what is wrong and what to do.
type DamagedError struct {
	// Dir is the data directory.
	Dir string
	// Problem says what is wrong, naming the file.
	Problem string
}

func (e *DamagedError) Error() string {
	return fmt.Sprintf("buffer at %s is damaged: %s; salvage what is readable into a new buffer with "+
		"'gatewayctl buffer salvage --data-dir %s --out NEWDIR' and start on that, or move the directory aside to start empty "+
		"(undelivered batches in it are lost), or restore it from a backup", e.Dir, e.Problem, e.Dir)
}

// Is makes errors.Is(err, ErrDamaged) true.
func (e *DamagedError) Is(target error) bool { return target == ErrDamaged }

func damaged(dir, format string, args ...any) error {
	return &DamagedError{Dir: dir, Problem: fmt.Sprintf(format, args...)}
}

// openError classifies an error of badger.Open after checkDirectory found
// nothing wrong: anything but a lock, permission, space or read-only file
// system problem means files Badger cannot read.
func openError(dir string, err error) error {
	msg := err.Error()
	if strings.Contains(msg, "Cannot acquire directory lock") {
		return &InUseError{Dir: dir, Err: err}
	}
	for _, env := range []string{"permission denied",
		"no space left on device", "read-only file system", "too many open files", "cannot allocate memory"} {
		if strings.Contains(msg, env) {
			return fmt.Errorf("opening buffer %s: %w", dir, err)
		}
	}
	return damaged(dir, "badger cannot open it: %v", err)
}

// ErrInUse matches (errors.Is) every *InUseError.
var ErrInUse = errors.New("buffer: in use by another process")

// InUseError reports a data directory another process (a running gatewayd)
// holds: Badger locks it for as long as it is open.
type InUseError struct {
	Dir string
	Err error
}

func (e *InUseError) Error() string {
	return fmt.Sprintf("opening buffer %s: another process is using it: %v", e.Dir, e.Err)
}

// Is makes errors.Is(err, ErrInUse) true.
func (e *InUseError) Is(target error) bool { return target == ErrInUse }

func (e *InUseError) Unwrap() error { return e.Err }

// checkNotInUse fails when another process holds the directory (Badger
// flocks the directory itself), so that checkDirectory never reads the
// files of a live database.
func checkNotInUse(dir string) error {
	f, err := os.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("opening buffer %s: %w", dir, err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return &InUseError{Dir: dir, Err: err}
	}
	return syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
}

// Badger's on-disk formats that checkDirectory reads (badger v4.9.6).
const (
	manifestName      = "MANIFEST"
	manifestMagic     = "Bdgr"
	manifestVersion   = 8  // badgerMagicVersion, manifest.go
	walHeaderSize     = 20 // vlogHeaderSize: key id and IV, value.go
	walBitTxn         = 1 << 6
	walBitFinTxn      = 1 << 7
	walMaxKeyLen      = 1 << 16 // safeRead.Entry
	sectorSize        = 4096    // page size: the unit the kernel writes back
	tornSectorSize    = 512     // a disk sector: the unit a power cut tears a page write into
	defaultCompressed = options.Snappy
)

// checkDirectory finds what badger.Open would silently lose in dir, before
// Badger touches it:
//
//   - a write-ahead log (.mem) whose replay would stop at damage followed
//     by later committed transactions, or that was cut short: Badger
//     truncates the log where its replay stops (memtable.go
//     memTable.UpdateSkipList). A torn tail — the last, unacknowledged
//     transaction of a crash, partly written, followed by zeros — is normal;
//   - a table the MANIFEST lists that is missing, truncated or fails its
//     checksums (Badger verifies only the index at open, and panics on
//     some truncations: table.go initBiggestAndSmallest);
//   - a table the MANIFEST does not list (a truncated or lost MANIFEST)
//     whose data exists nowhere else: Badger deletes such tables at open
//     (levels.go revertToManifest). A table left by a crash before its
//     MANIFEST record was written holds data that a listed table or a
//     write-ahead log also holds; that is normal.
//
// Damage Badger itself reports at open (a bad MANIFEST checksum, a bad
// KEYREGISTRY) is left to Badger; openError reports it.
func checkDirectory(dir string, logger *slog.Logger) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("opening buffer %s: %w", dir, err)
	}
	tables, mems := listBadgerFiles(entries)
	logs, err := checkLogs(dir, mems, logger)
	if err != nil {
		return err
	}
	listed, deleted, err := readManifest(filepath.Join(dir, manifestName))
	if err != nil {
		return damaged(dir, "%v", err)
	}
	listedMax, err := checkListedTables(dir, tables, listed)
	if err != nil {
		return err
	}
	return checkUnlistedTables(dir, tables, listed, deleted, listedMax, logs, logger)
}

// listBadgerFiles returns the directory's tables by id and its
// write-ahead logs, sorted by name.
func listBadgerFiles(entries []fs.DirEntry) (map[uint64]string, []string) {
	tables := map[uint64]string{}
	var mems []string
	for _, e := range entries {
		name := e.Name()
		switch {
		case strings.HasSuffix(name, ".sst"):
			id, err := strconv.ParseUint(strings.TrimSuffix(name, ".sst"), 10, 64)
			if err == nil {
				tables[id] = name
			}
		case strings.HasSuffix(name, ".mem"):
			mems = append(mems, name)
		}
	}
	sort.Strings(mems)
	return tables, mems
}

// checkLogs scans every write-ahead log (scanWAL): a damaged one is a
// *DamagedError, a torn tail is logged and dropped.
func checkLogs(dir string, mems []string, logger *slog.Logger) ([]walScan, error) {
	var logs []walScan
	for _, name := range mems {
		s, err := scanWAL(filepath.Join(dir, name))
		if err != nil {
			return nil, damaged(dir, "%v", err)
		}
		if s.problem != "" {
			return nil, damaged(dir, "write-ahead log %s %s", name, s.problem)
		}
		if s.tornBytes > 0 {
			logger.Info("write-ahead log ends in a torn, unacknowledged commit; it is dropped", "file", name,
				"offset", s.validEnd, "bytes", s.tornBytes)
		}
		logs = append(logs, s)
	}
	return logs, nil
}

// checkListedTables checks that every table the MANIFEST lists is there
// and passes its checksums, and returns the newest version they hold.
func checkListedTables(dir string, tables map[uint64]string, listed map[uint64]manifestTable) (uint64, error) {
	ids := slices.Sorted(maps.Keys(listed))
	for _, id := range ids {
		if _, ok := tables[id]; !ok {
			return 0, damaged(dir, "the MANIFEST lists table %06d.sst, which is missing", id)
		}
	}
	infos, errs := inspectTables(len(ids), func(i int) (tableInfo, error) {
		return inspectTable(filepath.Join(dir, tables[ids[i]]), options.CompressionType(listed[ids[i]].Compression), false)
	})
	var listedMax uint64
	for i, id := range ids {
		if errs[i] != nil {
			return 0, damaged(dir, "table %s: %v", tables[id], errs[i])
		}
		listedMax = max(listedMax, infos[i].maxVersion)
	}
	return listedMax, nil
}

// checkUnlistedTables checks the tables the MANIFEST does not list, which
// Badger deletes at open: each must be compacted away already (deleted),
// unreadable (a crash interrupted its writing), or hold only versions a
// listed table (up to listedMax) or a write-ahead log also holds.
func checkUnlistedTables(dir string, tables map[uint64]string, listed map[uint64]manifestTable, deleted map[uint64]bool,
	listedMax uint64, logs []walScan, logger *slog.Logger) error {
	for id, name := range tables {
		if _, ok := listed[id]; ok {
			continue
		}
		if deleted[id] {
			continue // compacted away; Badger had not removed the file yet
		}
		info, err := inspectTable(filepath.Join(dir, name), defaultCompressed, true)
		if err != nil {
			// A table a crash interrupted while it was being written.
			logger.Warn("unreadable table the MANIFEST does not list; Badger will delete it", "file", name, "err", err)
			continue
		}
		if info.maxVersion <= listedMax || coveredByLog(info, logs) {
			logger.Info("table the MANIFEST does not list holds only data kept elsewhere; Badger will delete it",
				"file", name)
			continue
		}
		return damaged(dir, "table %s is not listed in the MANIFEST (truncated or lost?) but holds writes "+
			"(versions %d-%d) found in no listed table or write-ahead log; Badger would delete it",
			name, info.minVersion, info.maxVersion)
	}
	return nil
}

// coveredByLog reports whether a write-ahead log holds every version of the
// table: the table is the flush of that log, interrupted before its
// MANIFEST record.
func coveredByLog(t tableInfo, logs []walScan) bool {
	for _, l := range logs {
		if l.txns > 0 && t.minVersion >= l.minVersion && t.maxVersion <= l.maxVersion {
			return true
		}
	}
	return false
}

type manifestTable struct {
	Level       uint32
	Compression uint32
}

// readManifest returns the tables the MANIFEST lists and those it records
// as deleted, replaying it as Badger does (manifest.go ReplayManifestFile):
// a torn last record is ignored (Badger truncates it; tables it listed
// are then checked as unlisted ones); a record failing its checksum is
// damage (Badger refuses it too).
func readManifest(path string) (map[uint64]manifestTable, map[uint64]bool, error) {
	listed := map[uint64]manifestTable{}
	deleted := map[uint64]bool{}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return listed, deleted, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading the MANIFEST: %w", err)
	}
	if len(data) < 8 || string(data[:4]) != manifestMagic {
		return nil, nil, fmt.Errorf("the MANIFEST has %d bytes and no valid header", len(data))
	}
	if v := binary.BigEndian.Uint16(data[6:8]); v != manifestVersion {
		return listed, deleted, nil // Badger reports the version
	}
	for off := 8; off+8 <= len(data); {
		n := int(binary.BigEndian.Uint32(data[off:]))
		sum := binary.BigEndian.Uint32(data[off+4:])
		if n > len(data)-off-8 {
			break // torn last record
		}
		rec := data[off+8 : off+8+n]
		if crc32.Checksum(rec, castagnoli) != sum {
			return nil, nil, fmt.Errorf("the MANIFEST record at offset %d fails its checksum", off)
		}
		var cs pb.ManifestChangeSet
		if err := proto.Unmarshal(rec, &cs); err != nil {
			return nil, nil, fmt.Errorf("the MANIFEST record at offset %d is malformed: %v", off, err)
		}
		for _, c := range cs.Changes {
			switch c.Op {
			case pb.ManifestChange_CREATE:
				listed[c.Id] = manifestTable{Level: c.Level, Compression: c.Compression}
			case pb.ManifestChange_DELETE:
				delete(listed, c.Id)
				deleted[c.Id] = true
			}
		}
		off += 8 + n
	}
	return listed, deleted, nil
}

// inspectTables runs inspect for 0..n-1 on every CPU: verifying every
// block of every table is, after the records' scan, the largest part of
// the time to open a large buffer.
func inspectTables(n int, inspect func(i int) (tableInfo, error)) ([]tableInfo, []error) {
	infos := make([]tableInfo, n)
	errs := make([]error, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), 8, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				infos[i], errs[i] = inspect(i)
			}
		}()
	}
	wg.Wait()
	return infos, errs
}

type tableInfo struct {
	minVersion, maxVersion uint64
}

// inspectTable opens a table read-only, verifies every block's checksum
// and returns its version range (the minimum only when minVersion is set:
// it reads every key).
func inspectTable(path string, compression options.CompressionType, minVersion bool) (info tableInfo, err error) {
	err = withTable(path, compression, options.OnTableRead, func(t *table.Table) error {
		info.maxVersion = t.MaxVersion()
		if minVersion {
			info.minVersion = math.MaxUint64
			it := t.NewIterator(0)
			defer it.Close()
			for it.Rewind(); it.Valid(); it.Next() {
				info.minVersion = min(info.minVersion, parseTs(it.Key()))
			}
		}
		return nil
	})
	return info, err
}

// withTable opens a table read-only through Badger's reader, verifying
// checksums as chk says, and calls fn with it. Badger's panics on some
// truncated tables (table.go initBiggestAndSmallest re-panics with a dump)
// are returned as errors.
func withTable(path string, compression options.CompressionType, chk options.ChecksumVerificationMode,
	fn func(*table.Table) error) (err error) {
	mf, err := z.OpenMmapFile(path, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("opening: %w", err)
	}
	var t *table.Table
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("unreadable (truncated?): %v", firstLine(fmt.Sprint(r)))
		}
		// OpenTable closes the file on some errors and not on others; a
		// closed file fails Stat, and must not be unmapped twice.
		if t == nil {
			if _, serr := mf.Fd.Stat(); serr == nil {
				_ = mf.Close(-1)
			}
		}
	}()
	t, err = table.OpenTable(mf, table.Options{
		ChkMode: chk, Compression: compression, BlockSize: 16 << 10, BloomFalsePositive: 0.01,
	})
	if err != nil {
		return err
	}
	defer func() { _ = t.MmapFile.Close(-1) }()
	return fn(t)
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func parseTs(key []byte) uint64 {
	if len(key) <= 8 {
		return 0
	}
	return math.MaxUint64 - binary.BigEndian.Uint64(key[len(key)-8:])
}

// walScan is what replaying a write-ahead log finds.
type walScan struct {
	// validEnd is where Badger truncates the log: the end of the last
	// complete transaction.
	validEnd int
	// txns counts the complete transactions; minVersion and maxVersion are
	// their commit timestamps.
	txns                   int
	minVersion, maxVersion uint64
	// tornBytes is how many bytes a torn tail holds (dropped, normal).
	tornBytes int
	// problem says why the log is damaged, or "".
	problem string
}

// walEntry is one entry of a write-ahead log (memtable.go encodeEntry:
// header, key with version, value, CRC-32C of all three).
type walEntry struct {
	meta  byte
	key   []byte
	value []byte
	size  int
}

// Why reading an entry stopped.
const (
	walOK = iota
	walBad
	walEOF
	walMalformed // Badger fails the open (binary.ReadUvarint overflow)
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func readWALEntry(data []byte, off int) (walEntry, int) {
	var e walEntry
	if off+2 > len(data) {
		return e, walEOF
	}
	e.meta = data[off]
	p := off + 2
	var lens [3]uint64
	for i := range lens {
		v, n := binary.Uvarint(data[p:])
		if n == 0 {
			return e, walEOF
		}
		if n < 0 {
			return e, walMalformed
		}
		lens[i] = v
		p += n
	}
	klen, vlen := lens[0], lens[1]
	if klen > walMaxKeyLen {
		return e, walBad
	}
	if vlen > uint64(len(data)) || p+int(klen)+int(vlen)+4 > len(data) {
		return e, walEOF
	}
	end := p + int(klen) + int(vlen)
	if crc32.Checksum(data[off:end], castagnoli) != binary.BigEndian.Uint32(data[end:]) {
		return e, walBad
	}
	e.key, e.value = data[p:p+int(klen)], data[p+int(klen):end]
	e.size = end + 4 - off
	if klen == 0 {
		return e, walBad // Badger stops at an empty key (Entry.isZero)
	}
	return e, walOK
}

// entryVersion is the commit timestamp an entry belongs to.
func entryVersion(e walEntry) uint64 {
	if e.meta&walBitFinTxn != 0 {
		v, _ := strconv.ParseUint(string(e.value), 10, 64)
		return v
	}
	return parseTs(e.key)
}

// scanWAL replays a .mem file as Badger does (memtable.go logFile.iterate)
// and classifies what lies after the point where the replay stops.
//
// Badger writes a transaction's entries into the mmapped file and msyncs
// it before the commit returns; the next transaction starts only after
// that. A crash can therefore leave, after the last complete transaction,
// only part of one transaction — a prefix of it (process killed mid-copy),
// or for a power cut during its msync any subset of its sectors, the rest
// as last synced: zero, since the log is preallocated — and zeros beyond. That tail is dropped and is normal: its
// commit had not returned, so no batch in it was acknowledged. Anything
// else is damage, because acknowledged commits would be dropped with it:
//   - a checksummed entry of a different transaction after the stop point,
//   - a complete transaction after unreadable bytes that hold no sector
//     left unwritten (bytes that were written and then damaged, not never
//     written; see hasUnwrittenSector),
//   - non-zero bytes further than one transaction from the stop point,
//   - a file that ends inside its data (cut short).
func scanWAL(path string) (walScan, error) {
	s := walScan{minVersion: math.MaxUint64}
	data, err := readWAL(path)
	if err != nil || len(data) == 0 {
		return s, err
	}
	if len(data) < walHeaderSize {
		s.problem = fmt.Sprintf("has %d bytes, less than its header: it was cut short", len(data))
		return s, nil
	}
	off, open, stop := s.replay(data)
	if stop == walMalformed {
		s.problem = fmt.Sprintf("has a malformed entry at offset %d", off)
		return s, nil
	}
	s.checkTail(data, off, open, stop)
	return s, nil
}

// readWAL reads a whole .mem file. An empty file is a new log whose size
// was never synced (the file system made its name durable, not its
// length): nothing in it was acknowledged, since every commit syncs the
// log, and Open removes it.
func readWAL(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading write-ahead log: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("reading write-ahead log: %w", err)
	}
	// Read, not mapped: a write-ahead log is sparse past its last entry,
	// and on a full tmpfs a mapped read of a hole is a SIGBUS.
	data := make([]byte, int(fi.Size()))
	if _, err := io.ReadFull(f, data); err != nil {
		return nil, fmt.Errorf("reading write-ahead log %s: %w", filepath.Base(path), err)
	}
	return data, nil
}

// replay reads complete transactions from the header on, as Badger's
// replay does, up to the first entry that fails: it records them in s and
// returns where it stopped, the commit timestamp of the transaction it
// was reading there (0: none), and why it stopped.
func (s *walScan) replay(data []byte) (off int, open uint64, stop int) {
	off = walHeaderSize
	s.validEnd = off
	for {
		e, st := readWALEntry(data, off)
		if st != walOK {
			return off, open, st
		}
		switch {
		case e.meta&walBitTxn != 0:
			ts := parseTs(e.key)
			if open == 0 {
				open = ts
			}
			if ts != open {
				return off, open, walBad
			}
		case e.meta&walBitFinTxn != 0:
			if entryVersion(e) != open {
				return off, open, walBad
			}
			s.txns++
			s.minVersion, s.maxVersion = min(s.minVersion, open), max(s.maxVersion, open)
			open = 0
			s.validEnd = off + e.size
		default:
			if open != 0 {
				return off, open, walBad
			}
			ts := parseTs(e.key)
			s.minVersion, s.maxVersion = min(s.minVersion, ts), max(s.maxVersion, ts)
			s.validEnd = off + e.size
		}
		off += e.size
	}
}

// checkTail classifies what lies after the point off where the replay
// stopped (stop, inside transaction open), and sets s.tornBytes for a torn
// tail or s.problem for damage (see scanWAL).
func (s *walScan) checkTail(data []byte, off int, open uint64, stop int) {
	size := len(data)
	lastNonZero := max(bytes.LastIndexFunc(data, func(r rune) bool { return r != 0 }), 0)
	// Badger's own truncation after a replay leaves the file ending exactly
	// at a transaction; a file ending inside data was cut. (A torn entry in
	// a live log does not run past the end: the log is preallocated to
	// twice the memtable and zero beyond what was written.)
	if stop == walEOF || off >= size || lastNonZero == size-1 {
		if s.validEnd != size {
			s.problem = fmt.Sprintf("ends at offset %d inside a transaction that starts at offset %d: it was cut short",
				size, s.validEnd)
		}
		return
	}
	if lastNonZero < s.validEnd {
		return // clean: zeros after the last transaction
	}
	s.tornBytes = lastNonZero + 1 - s.validEnd
	// One transaction is at most 15% of a memtable (Badger's maxBatchSize)
	// plus entry headers; a live log is two memtables long.
	window := size*3/20 + 2*sectorSize
	if s.tornBytes > window {
		s.problem = fmt.Sprintf("has %d bytes of unreadable data after offset %d, more than one transaction: "+
			"committed transactions would be dropped", s.tornBytes, s.validEnd)
		return
	}
	later := entriesAfter(data, off, lastNonZero, open)
	switch {
	case len(later.versions) > 1:
		s.problem = fmt.Sprintf("is damaged at offset %d: Badger's replay stops there, but checksummed entries "+
			"of later transactions follow; they would be dropped", off)
	case later.first >= 0 && later.fin && open == 0 && !hasUnwrittenSector(data, off, later.first):
		s.problem = fmt.Sprintf("is damaged at offset %d: a complete transaction follows unreadable bytes "+
			"that were written, not left unwritten by a crash; it would be dropped", off)
	}
}

// tailEntries is what entriesAfter finds after the replay's stop point.
type tailEntries struct {
	// versions holds the commit timestamps of the checksummed entries
	// found, and of the transaction open at the stop point.
	versions map[uint64]bool
	// first is the offset of the first checksummed entry found (-1: none).
	first int
	// fin is set when a transaction's closing entry was found.
	fin bool
}

// entriesAfter looks for checksummed entries from offset from to offset
// to (inclusive), stepping byte by byte over what does not read as one;
// open is the transaction the replay stopped in (0: none).
func entriesAfter(data []byte, from, to int, open uint64) tailEntries {
	t := tailEntries{versions: map[uint64]bool{}, first: -1}
	if open != 0 {
		t.versions[open] = true
	}
	for p := from; p <= to; {
		e, st := readWALEntry(data, p)
		if st != walOK {
			p++
			continue
		}
		if t.first < 0 {
			t.first = p
		}
		t.versions[entryVersion(e)] = true
		t.fin = t.fin || e.meta&walBitFinTxn != 0
		p += e.size
	}
	return t
}

// hasUnwrittenSector reports whether data[from:to], the unreadable bytes
// between the last complete transaction and a later checksummed one, holds
// what a sector left unwritten by a power cut looks like: zeros from from
// to the next sector boundary (the part of the transaction that shared a
// sector with the synced one before it, reverted to what was synced), or a
// whole aligned sector of zeros. A disk persists any subset of the sectors
// written since the last sync; bytes that were written and later damaged
// are not zero.
func hasUnwrittenSector(data []byte, from, to int) bool {
	zero := func(a, b int) bool {
		return bytes.IndexFunc(data[a:b], func(r rune) bool { return r != 0 }) < 0
	}
	first := (from/tornSectorSize + 1) * tornSectorSize
	if from%tornSectorSize != 0 && first <= to && zero(from, first) {
		return true
	}
	for p := (from + tornSectorSize - 1) / tornSectorSize * tornSectorSize; p+tornSectorSize <= to; p += tornSectorSize {
		if zero(p, p+tornSectorSize) {
			return true
		}
	}
	return false
}

// cleanRecordName is the file Close leaves after a clean shutdown.
const cleanRecordName = "GATEWAY-CLEAN-SHUTDOWN"

// cleanRecord is what a cleanly closed buffer held. The next Open compares
// it with what it reads: after a clean close nothing may differ, so a
// difference is files lost or damaged while the gateway was stopped.
type cleanRecord struct {
	Seq              uint64 `json:"seq"`
	PendingBatches   int64  `json:"pending_batches"`
	DeliveredMarkers int64  `json:"delivered_markers"`
	DeadBatches      int64  `json:"dead_batches"`
	StateRecords     int64  `json:"state_records"`
	// HistoryBatches is absent (0) in records written before the history
	// existed, when there was none.
	HistoryBatches int64 `json:"history_batches"`
}

func (b *Buffer) cleanRecord() cleanRecord {
	return cleanRecord{
		Seq: b.nextSeq, PendingBatches: b.pendingBatches.Load(),
		DeliveredMarkers: b.usage.deliveredMarkers.Load(), DeadBatches: b.usage.deadBatches.Load(),
		StateRecords: b.usage.stateRecords.Load(), HistoryBatches: b.usage.historyBatches.Load(),
	}
}

func (want cleanRecord) matches(got cleanRecord) error {
	// The sequence counter may run ahead of what is on disk (a failed
	// group consumes numbers), never behind.
	if got.Seq > want.Seq || got.PendingBatches != want.PendingBatches ||
		got.DeliveredMarkers != want.DeliveredMarkers || got.DeadBatches != want.DeadBatches ||
		got.StateRecords != want.StateRecords || got.HistoryBatches != want.HistoryBatches {
		return fmt.Errorf("it was closed cleanly holding %d pending batches, %d delivered markers, %d dead "+
			"letters, %d state records and %d history records, but holds %d, %d, %d, %d and %d: files were "+
			"lost or damaged while the gateway was stopped", want.PendingBatches, want.DeliveredMarkers,
			want.DeadBatches, want.StateRecords, want.HistoryBatches, got.PendingBatches, got.DeliveredMarkers,
			got.DeadBatches, got.StateRecords, got.HistoryBatches)
	}
	return nil
}

func readCleanRecord(dir string) (*cleanRecord, error) {
	raw, err := os.ReadFile(filepath.Join(dir, cleanRecordName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r cleanRecord
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", cleanRecordName, err)
	}
	return &r, nil
}

// writeCleanRecord writes the record durably: temporary file, fsync,
// rename, directory fsync.
func writeCleanRecord(dir string, r cleanRecord) error {
	raw, _ := json.Marshal(r)
	tmp := filepath.Join(dir, cleanRecordName+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("writing the clean-shutdown record: %w", err)
	}
	_, err = f.Write(append(raw, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, cleanRecordName))
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("writing the clean-shutdown record: %w", err)
	}
	return nil
}

// removeCleanRecord removes the record once the data matched it: a crash
// from now on leaves none.
func removeCleanRecord(dir string) error {
	err := os.Remove(filepath.Join(dir, cleanRecordName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("removing the clean-shutdown record: %w", err)
	}
	return nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// removeEmptyLogs deletes the write-ahead logs and value log files of no
// bytes in dir: files created just before a power cut, whose names reached
// the disk but not their sizes (a file system that makes names durable
// without sizes). Nothing in them was acknowledged (every commit syncs
// them, sizes included), no value pointer points into them, and Badger
// refuses to open an empty log it did not just create.
func removeEmptyLogs(dir string, logger *slog.Logger) error {
	var logs []string
	for _, pattern := range []string{"*.mem", "*.vlog"} {
		found, err := filepath.Glob(filepath.Join(dir, pattern))
		if err != nil {
			return err
		}
		logs = append(logs, found...)
	}
	for _, path := range logs {
		fi, err := os.Stat(path)
		if err != nil || fi.Size() != 0 {
			continue
		}
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("removing the empty log file %s: %w", filepath.Base(path), err)
		}
		logger.Warn("removed an empty log file (created just before a crash; it held nothing)",
			"file", filepath.Base(path))
	}
	return nil
}
