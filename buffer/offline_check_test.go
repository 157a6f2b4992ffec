package buffer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// smallOptions make Badger's files small: a 1 MiB memtable, values from
// 128 KiB in the value log.
var smallOptions = Options{MemTableSize: 1 << 20}

// copyDir copies dir's files (not LOCK) into a new directory. Copying the
// files of an open buffer gives what a kill -9 leaves: everything written
// to the page cache, nothing Close would have done. Badger may replace a
// file while it is copied (a memtable flushed to a table, then deleted):
// the copy is taken again until one sees the same files from start to end.
func copyDir(tb testing.TB, dir string) string {
	tb.Helper()
	for attempt := 1; ; attempt++ {
		dst := tb.TempDir()
		before := dirNames(tb, dir)
		whole := true
		for _, name := range before {
			if !copyFile(tb, filepath.Join(dir, name), filepath.Join(dst, name)) {
				whole = false
				break
			}
		}
		if whole && slices.Equal(before, dirNames(tb, dir)) {
			return dst
		}
		require.Less(tb, attempt, 20, "the directory kept changing while it was copied")
		time.Sleep(50 * time.Millisecond)
	}
}

// dirNames lists dir's file names but LOCK, sorted.
func dirNames(tb testing.TB, dir string) []string {
	ents, err := os.ReadDir(dir)
	require.NoError(tb, err)
	var names []string
	for _, e := range ents {
		if e.Name() != "LOCK" {
			names = append(names, e.Name())
		}
	}
	return names
}

// copyFile copies src to dst; false when src is gone.
func copyFile(tb testing.TB, src, dst string) bool {
	in, err := os.Open(src)
	if errors.Is(err, fs.ErrNotExist) {
		return false
	}
	require.NoError(tb, err)
	defer in.Close()
	out, err := os.Create(dst)
	require.NoError(tb, err)
	_, err = io.Copy(out, in)
	require.NoError(tb, err)
	require.NoError(tb, out.Close())
	return true
}

func batchN(i int, size int) Entry {
	return entry(fmt.Sprintf("batch-%03d", i), fmt.Sprintf("%03d", i)+string(make([]byte, size)))
}

// fill commits n batches of size bytes, one commit each.
func fill(tb testing.TB, b *Buffer, from, n, size int) {
	tb.Helper()
	for i := from; i < from+n; i++ {
		require.Equal(tb, []Outcome{Stored}, commit(tb, b, batchN(i, size)))
	}
}

// closedBuffer returns a cleanly closed buffer holding n batches.
func closedBuffer(tb testing.TB, n, size int) string {
	tb.Helper()
	dir := tb.TempDir()
	b, err := Open(dir, smallOptions, nil, nil)
	require.NoError(tb, err)
	fill(tb, b, 0, n, size)
	require.NoError(tb, b.Close())
	return dir
}

// crashedBuffer returns what a kill -9 leaves of a buffer holding n
// batches: their commits are in a write-ahead log (.mem).
func crashedBuffer(tb testing.TB, n, size int) (string, *Buffer) {
	tb.Helper()
	b := open(tb, tb.TempDir(), smallOptions)
	fill(tb, b, 0, n, size)
	return copyDir(tb, b.dir), b
}

func file(tb testing.TB, dir, suffix string) string {
	tb.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(tb, err)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), suffix) {
			return filepath.Join(dir, e.Name())
		}
	}
	tb.Fatalf("no %s file in %s", suffix, dir)
	return ""
}

func writeAt(tb testing.TB, path string, off int64, data []byte) {
	tb.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(tb, err)
	_, err = f.WriteAt(data, off)
	require.NoError(tb, err)
	require.NoError(tb, f.Close())
}

func size(tb testing.TB, path string) int64 {
	tb.Helper()
	fi, err := os.Stat(path)
	require.NoError(tb, err)
	return fi.Size()
}

// walEnd is where the replay of a write-ahead log ends.
func walEnd(tb testing.TB, path string) int {
	tb.Helper()
	s, err := scanWAL(path)
	require.NoError(tb, err)
	require.Empty(tb, s.problem)
	return s.validEnd
}

// requireOpens opens dir and checks it holds the batches batch-000 to
// batch-(n-1).
func requireOpens(tb testing.TB, dir string, n int) {
	tb.Helper()
	b, err := Open(dir, smallOptions, nil, nil)
	require.NoError(tb, err)
	defer func() { require.NoError(tb, b.Close()) }()
	ids := pendingIDs(tb, b)
	require.Len(tb, ids, n)
	for i, id := range ids {
		require.Equal(tb, fmt.Sprintf("batch-%03d", i), id)
	}
}

// requireDamaged checks that Open refuses dir with a message naming the
// problem and what to do, and changes nothing it could still be repaired
// from.
func requireDamaged(tb testing.TB, dir string, want ...string) {
	tb.Helper()
	before, err := os.ReadDir(dir)
	require.NoError(tb, err)
	_, err = Open(dir, smallOptions, nil, nil)
	require.ErrorIs(tb, err, ErrDamaged)
	msg := err.Error()
	require.Contains(tb, msg, "buffer at "+dir+" is damaged: ")
	require.Contains(tb, msg, "move the directory aside to start empty (undelivered batches in it are lost), or restore it from a backup")
	for _, w := range want {
		require.Contains(tb, msg, w)
	}
	tb.Logf("%s", msg)
	after, err := os.ReadDir(dir)
	require.NoError(tb, err)
	names := func(es []os.DirEntry) []string {
		var out []string
		for _, e := range es {
			if e.Name() != "LOCK" {
				out = append(out, e.Name())
			}
		}
		return out
	}
	// Refusals decided before Badger opens the directory leave it as it
	// was; the others come after Badger replayed it (nothing more is lost).
	if !strings.Contains(msg, "badger cannot open it") && !strings.Contains(msg, "reading its records") &&
		!strings.Contains(msg, "closed cleanly") {
		require.Equal(tb, names(before), names(after), "a refused directory is left as it was")
	}
}

func TestHealthyBuffersOpen(t *testing.T) {
	t.Run("closed cleanly", func(t *testing.T) {
		requireOpens(t, closedBuffer(t, 50, 500), 50)
	})
	t.Run("killed", func(t *testing.T) {
		dir, _ := crashedBuffer(t, 50, 500)
		requireOpens(t, dir, 50)
	})
	t.Run("killed twice", func(t *testing.T) {
		dir, _ := crashedBuffer(t, 50, 500)
		b := open(t, dir, smallOptions)
		fill(t, b, 50, 10, 500)
		requireOpens(t, copyDir(t, dir), 60)
	})
}

// TestTornWriteAheadLogTailIsDropped builds what a crash during the last
// commit leaves: the log of n acknowledged commits followed by part of one
// more, and checks that the buffer opens with the n batches.
func TestTornWriteAheadLogTailIsDropped(t *testing.T) {
	tests := []struct {
		name string
		// applies, when set, says whether the last commit's layout allows
		// the tear. Badger writes a transaction's entries in the order of
		// a map, so which entry comes first varies from run to run.
		applies func(tb testing.TB, mem string, start int) bool
		tear    func(tb testing.TB, mem string, start, end int)
	}{
		{"process killed mid-copy: a prefix of the commit", nil, func(tb testing.TB, mem string, start, end int) {
			writeAt(tb, mem, int64(start+(end-start)/2), make([]byte, end-start-(end-start)/2))
		}},
		{"power cut during its msync: a middle page never written", nil, func(tb testing.TB, mem string, start, end int) {
			page := (start/sectorSize + 2) * sectorSize
			require.Less(tb, page+sectorSize, end, "the commit spans several pages")
			writeAt(tb, mem, int64(page), make([]byte, sectorSize))
		}},
		{"power cut: only the first page of the commit missing", nil, func(tb testing.TB, mem string, start, end int) {
			// From the commit's start to the next page boundary and the page after.
			next := (start/sectorSize + 1) * sectorSize
			writeAt(tb, mem, int64(start), make([]byte, next+sectorSize-start))
		}},
		{"power cut: the commit's part of the page it shares with the one before missing, the rest kept",
			nil, func(tb testing.TB, mem string, start, end int) {
				require.NotZero(tb, start%sectorSize, "the commit starts inside a page")
				next := (start/sectorSize + 1) * sectorSize
				writeAt(tb, mem, int64(start), make([]byte, next-start))
			}},
		{"power cut: the commit's part of the sector it shares with the one before missing, the rest kept",
			nil, func(tb testing.TB, mem string, start, end int) {
				require.NotZero(tb, start%tornSectorSize, "the commit starts inside a sector")
				next := (start/tornSectorSize + 1) * tornSectorSize
				writeAt(tb, mem, int64(start), make([]byte, next-start))
			}},
		{"power cut: one sector inside the commit's first entry missing, the rest kept",
			firstEntrySpansSector,
			func(tb testing.TB, mem string, start, end int) {
				sector := (start/tornSectorSize + 1) * tornSectorSize
				data, err := os.ReadFile(mem)
				require.NoError(tb, err)
				e, st := readWALEntry(data, start)
				require.Equal(tb, walOK, st)
				require.Greater(tb, start+e.size, sector, "the first entry spans a sector boundary")
				writeAt(tb, mem, int64(sector), make([]byte, tornSectorSize))
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for attempt := 1; ; attempt++ {
				img, mem, start, end := lastCommitImage(t)
				if tt.applies != nil && !tt.applies(t, mem, start) {
					require.Less(t, attempt, 20, "no commit in 20 had the layout this tear needs")
					continue
				}
				tt.tear(t, mem, start, end)
				requireOpens(t, img, 20)
				return
			}
		})
	}
}

// lastCommitImage commits 20 batches one by one and then one group of 30
// (about 20 KiB), and returns a copy of the directory, its write-ahead
// log, and where the last commit starts and ends in it.
func lastCommitImage(tb testing.TB) (img, mem string, start, end int) {
	b := open(tb, tb.TempDir(), smallOptions)
	fill(tb, b, 0, 20, 300)
	start = walEnd(tb, file(tb, b.dir, ".mem"))
	var group []Entry
	for i := 20; i < 50; i++ {
		group = append(group, batchN(i, 600))
	}
	commit(tb, b, group...)
	img = copyDir(tb, b.dir)
	mem = file(tb, img, ".mem")
	return img, mem, start, walEnd(tb, mem)
}

// firstEntrySpansSector reports whether the entry at start crosses a
// torn-sector boundary.
func firstEntrySpansSector(tb testing.TB, mem string, start int) bool {
	data, err := os.ReadFile(mem)
	require.NoError(tb, err)
	e, st := readWALEntry(data, start)
	require.Equal(tb, walOK, st)
	return start+e.size > (start/tornSectorSize+1)*tornSectorSize
}

func TestDamageIsRefused(t *testing.T) {
	tests := []struct {
		name   string
		make   func(tb testing.TB) (dir string, healthy string, n int)
		damage func(tb testing.TB, dir string)
		want   []string
	}{
		{
			name: "write-ahead log: bytes corrupted in an early commit",
			make: crashed(100, 300),
			damage: func(tb testing.TB, dir string) {
				mem := file(tb, dir, ".mem")
				writeAt(tb, mem, int64(walEnd(tb, mem)/10), []byte("GARBAGEGARBAGE"))
			},
			want: []string{".mem is damaged at offset", "checksummed entries of later transactions follow"},
		},
		{
			name: "write-ahead log: the last commit's first bytes corrupted",
			make: crashed(30, 300),
			damage: func(tb testing.TB, dir string) {
				mem := file(tb, dir, ".mem")
				s, err := scanWAL(mem)
				require.NoError(tb, err)
				// Inside the key of the last transaction's first entry.
				writeAt(tb, mem, int64(lastTxnStart(tb, mem, s.validEnd)+6), []byte{0xff, 0xff, 0xff})
			},
			want: []string{"a complete transaction follows unreadable bytes"},
		},
		{
			name: "write-ahead log: cut short",
			make: crashed(100, 300),
			damage: func(tb testing.TB, dir string) {
				mem := file(tb, dir, ".mem")
				require.NoError(tb, os.Truncate(mem, int64(walEnd(tb, mem)/2+7)))
			},
			want: []string{".mem ends at offset", "it was cut short"},
		},
		{
			name: "write-ahead log: garbage far past its end",
			make: crashed(20, 300),
			damage: func(tb testing.TB, dir string) {
				mem := file(tb, dir, ".mem")
				writeAt(tb, mem, size(tb, mem)*3/4, []byte("GARBAGE"))
			},
			want: []string{"bytes of unreadable data after offset", "more than one transaction"},
		},
		{
			name: "MANIFEST truncated mid-record",
			make: closed(50, 500),
			damage: func(tb testing.TB, dir string) {
				m := filepath.Join(dir, "MANIFEST")
				require.NoError(tb, os.Truncate(m, size(tb, m)-5))
			},
			want: []string{"table 000001.sst is not listed in the MANIFEST", "Badger would delete it"},
		},
		{
			name: "MANIFEST truncated to its header",
			make: closed(50, 500),
			damage: func(tb testing.TB, dir string) {
				require.NoError(tb, os.Truncate(filepath.Join(dir, "MANIFEST"), 8))
			},
			want: []string{"is not listed in the MANIFEST"},
		},
		{
			name: "MANIFEST truncated inside its header",
			make: closed(50, 500),
			damage: func(tb testing.TB, dir string) {
				require.NoError(tb, os.Truncate(filepath.Join(dir, "MANIFEST"), 4))
			},
			want: []string{"the MANIFEST has 4 bytes and no valid header"},
		},
		{
			name: "MANIFEST deleted",
			make: closed(50, 500),
			damage: func(tb testing.TB, dir string) {
				require.NoError(tb, os.Remove(filepath.Join(dir, "MANIFEST")))
			},
			want: []string{"is not listed in the MANIFEST"},
		},
		{
			name: "MANIFEST bytes corrupted",
			make: closed(50, 500),
			damage: func(tb testing.TB, dir string) {
				m := filepath.Join(dir, "MANIFEST")
				writeAt(tb, m, size(tb, m)-6, []byte{0xde, 0xad, 0xbe})
			},
			want: []string{"the MANIFEST record at offset", "fails its checksum"},
		},
		{
			name: "table: a data block corrupted",
			make: closed(50, 500),
			damage: func(tb testing.TB, dir string) {
				sst := file(tb, dir, ".sst")
				writeAt(tb, sst, size(tb, sst)/3, []byte("GARBAGEGARBAGE"))
			},
			want: []string{"table 000001.sst", "checksum"},
		},
		{
			name: "table: the index corrupted",
			make: closed(50, 500),
			damage: func(tb testing.TB, dir string) {
				sst := file(tb, dir, ".sst")
				writeAt(tb, sst, size(tb, sst)-40, []byte("GARBAGE"))
			},
			want: []string{"table 000001.sst"},
		},
		{
			name: "table: truncated (Badger itself panics on this)",
			make: closed(50, 500),
			damage: func(tb testing.TB, dir string) {
				require.NoError(tb, os.Truncate(file(tb, dir, ".sst"), 1000))
			},
			want: []string{"table 000001.sst"},
		},
		{
			name: "table deleted",
			make: closed(50, 500),
			damage: func(tb testing.TB, dir string) {
				require.NoError(tb, os.Remove(file(tb, dir, ".sst")))
			},
			want: []string{"the MANIFEST lists table 000001.sst, which is missing"},
		},
		{
			name: "value log: large values corrupted",
			make: closed(10, 200<<10),
			damage: func(tb testing.TB, dir string) {
				vlog := file(tb, dir, "000001.vlog")
				writeAt(tb, vlog, size(tb, vlog)/2, []byte("GARBAGEGARBAGE"))
			},
			want: []string{"reading its records"},
		},
		{
			name: "value log deleted",
			make: closed(10, 200<<10),
			damage: func(tb testing.TB, dir string) {
				require.NoError(tb, os.Remove(file(tb, dir, "000001.vlog")))
			},
			want: []string{"reading its records"},
		},
		{
			name: "KEYREGISTRY corrupted",
			make: closed(10, 500),
			damage: func(tb testing.TB, dir string) {
				writeAt(tb, filepath.Join(dir, "KEYREGISTRY"), 10, []byte("GARBAGE"))
			},
			want: []string{"badger cannot open it"},
		},
		{
			name: "every data file lost while stopped",
			make: closed(10, 500),
			damage: func(tb testing.TB, dir string) {
				ents, err := os.ReadDir(dir)
				require.NoError(tb, err)
				for _, e := range ents {
					if e.Name() != cleanRecordName {
						require.NoError(tb, os.Remove(filepath.Join(dir, e.Name())))
					}
				}
			},
			want: []string{"closed cleanly holding 10 pending batches", "but holds 0"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, healthy, n := tt.make(t)
			tt.damage(t, dir)
			requireDamaged(t, dir, tt.want...)
			requireDamaged(t, dir, tt.want...) // and again: a refusal changes nothing
			requireOpens(t, healthy, n)
		})
	}
}

// crashed and closed make a damaged-to-be buffer and an untouched copy.
func crashed(n, size int) func(tb testing.TB) (string, string, int) {
	return func(tb testing.TB) (string, string, int) {
		dir, _ := crashedBuffer(tb, n, size)
		return dir, copyDir(tb, dir), n
	}
}

func closed(n, size int) func(tb testing.TB) (string, string, int) {
	return func(tb testing.TB) (string, string, int) {
		dir := closedBuffer(tb, n, size)
		return dir, copyDir(tb, dir), n
	}
}

// lastTxnStart finds where the last complete transaction of a log starts.
func lastTxnStart(tb testing.TB, mem string, end int) int {
	tb.Helper()
	data, err := os.ReadFile(mem)
	require.NoError(tb, err)
	start, off := walHeaderSize, walHeaderSize
	for off < end {
		e, st := readWALEntry(data, off)
		require.Equal(tb, walOK, st)
		off += e.size
		if e.meta&walBitFinTxn != 0 && off < end {
			start = off
		}
	}
	return start
}

// TestTablesLeftByACrashAreNotDamage covers tables a crash leaves before
// their MANIFEST record: Badger deletes them, which loses nothing.
func TestTablesLeftByACrashAreNotDamage(t *testing.T) {
	t.Run("compaction output: a copy of listed data", func(t *testing.T) {
		dir := closedBuffer(t, 50, 500)
		raw, err := os.ReadFile(file(t, dir, "000001.sst"))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "000009.sst"), raw, 0o644))
		requireOpens(t, dir, 50)
		require.NoFileExists(t, filepath.Join(dir, "000009.sst"))
	})
	t.Run("memtable flush: the data of a write-ahead log", func(t *testing.T) {
		img, _ := crashedBuffer(t, 50, 500)
		// Open a copy, which flushes the log into a table, and put that
		// table, unlisted, next to the log it came from.
		flushed := copyDir(t, img)
		b, err := Open(flushed, smallOptions, nil, nil)
		require.NoError(t, err)
		require.NoError(t, b.Close())
		raw, err := os.ReadFile(file(t, flushed, ".sst"))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(img, "000009.sst"), raw, 0o644))
		requireOpens(t, img, 50)
	})
	t.Run("a table half written", func(t *testing.T) {
		dir := closedBuffer(t, 50, 500)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "000009.sst"), make([]byte, 8192), 0o644))
		requireOpens(t, dir, 50)
	})
}

func TestOpenRefusesADirectoryInUse(t *testing.T) {
	b := open(t, t.TempDir(), smallOptions)
	_, err := Open(b.dir, smallOptions, nil, nil)
	require.ErrorContains(t, err, "another process is using it")
	require.NotErrorIs(t, err, ErrDamaged)
	_, err = b.Commit(context.Background(), []Entry{entry("a", "1")})
	require.NoError(t, err, "the first buffer is undisturbed")
}

// TestSmallerMemtableReplaysALargerLog lowers buffer.memtable_size after a
// crash that left a write-ahead log written with a larger memtable: Badger
// would replay it into an arena of the new size and panic; the buffer
// opens with the log's size and keeps every batch.
func TestSmallerMemtableReplaysALargerLog(t *testing.T) {
	b := open(t, t.TempDir(), Options{MemTableSize: 8 << 20})
	fill(t, b, 0, 3000, 1000) // about 3.5 MiB: more than a 1 MiB memtable's arena
	dir := copyDir(t, b.dir)
	size, err := memTableSizeFor(dir, 1<<20)
	require.NoError(t, err)
	require.Equal(t, int64(8<<20), size)
	requireOpensWith(t, dir, smallOptions, 3000)
	// Closed cleanly, no log holds data: the configured size applies.
	size, err = memTableSizeFor(dir, 1<<20)
	require.NoError(t, err)
	require.Equal(t, int64(1<<20), size)
	requireOpensWith(t, dir, smallOptions, 3000)
}

func requireOpensWith(tb testing.TB, dir string, opts Options, n int) {
	tb.Helper()
	b, err := Open(dir, opts, nil, nil)
	require.NoError(tb, err)
	defer func() { require.NoError(tb, b.Close()) }()
	require.Len(tb, pendingIDs(tb, b), n)
}

func TestRemoveEmptyLogs(t *testing.T) {
	dir := t.TempDir()
	for name, size := range map[string]int{"00001.mem": 0, "00002.mem": 10, "000001.vlog": 0, "000002.vlog": 20, "000003.sst": 0} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), make([]byte, size), 0o600))
	}
	require.NoError(t, removeEmptyLogs(dir, discardLogger()))
	names, err := filepath.Glob(filepath.Join(dir, "*"))
	require.NoError(t, err)
	for i := range names {
		names[i] = filepath.Base(names[i])
	}
	require.ElementsMatch(t, []string{"00002.mem", "000002.vlog", "000003.sst"}, names,
		"empty logs go, everything else stays")
}
