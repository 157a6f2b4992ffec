package buffer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
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

// checkUnlistedTables checks, in id order, the tables the MANIFEST does not list, which
// Badger deletes at open: each must be compacted away already (deleted),
// unreadable (a crash interrupted its writing), or hold only versions a
// listed table (up to listedMax) or a write-ahead log also holds.
func checkUnlistedTables(dir string, tables map[uint64]string, listed map[uint64]manifestTable, deleted map[uint64]bool,
	listedMax uint64, logs []walScan, logger *slog.Logger) error {
	// In id order, so that every check of one directory names the same
	// table.
	for _, id := range slices.Sorted(maps.Keys(tables)) {
		name := tables[id]
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
