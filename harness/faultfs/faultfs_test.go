package faultfs

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func mount(t *testing.T, opts ...func(*Options)) *FS {
	t.Helper()
	return Mount(t, filepath.Join(t.TempDir(), "backing"), opts...)
}

func strict(o *Options) { o.Names = Strict }

func (f *FS) path(name string) string { return filepath.Join(f.Dir(), name) }

func writeFile(t *testing.T, p string, data []byte, sync bool) {
	t.Helper()
	fh, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.Write(data); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := fh.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if err := fh.Close(); err != nil {
		t.Fatal(err)
	}
}

func appendFile(t *testing.T, p string, data []byte, sync bool) {
	t.Helper()
	fh, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if _, err := fh.Write(data); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := fh.Sync(); err != nil {
			t.Fatal(err)
		}
	}
}

func syncDir(t *testing.T, dir string) {
	t.Helper()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
}

func cut(t *testing.T, f *FS) {
	t.Helper()
	if err := f.PowerCut(); err != nil {
		t.Fatal(err)
	}
}

// wantFile checks p's content; want nil means p must not exist.
func wantFile(t *testing.T, p string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(p)
	if want == nil {
		if !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: want it gone, got %d bytes, err %v", filepath.Base(p), len(got), err)
		}
		return
	}
	if err != nil {
		t.Fatalf("%s: %v", filepath.Base(p), err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: got %d bytes %.40q, want %d bytes %.40q", filepath.Base(p), len(got), got, len(want), want)
	}
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i%251)
	}
	return b
}

func TestPowerCutKeepsOnlyFsyncedData(t *testing.T) {
	f := mount(t)
	synced := pattern(10000, 1)
	writeFile(t, f.path("a"), synced, true)
	appendFile(t, f.path("a"), []byte("not synced"), false)
	writeFile(t, f.path("b"), []byte("never synced"), false)
	// Overwrite durable pages in place, then shrink the file.
	fh, err := os.OpenFile(f.path("a"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteAt(bytes.Repeat([]byte{0xff}, 5000), 3000); err != nil {
		t.Fatal(err)
	}
	if err := fh.Truncate(100); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	wantFile(t, f.path("a"), synced[:100])

	cut(t, f)
	if st := f.Stats(); st.FilesRolled != 1 || st.BytesUndone != 10000 {
		t.Fatalf("stats %+v, want a rolled back, its 3 pages rewritten", st)
	}
	wantFile(t, f.path("a"), synced)
	// b's name was made durable by a's fsync? No: b was created after it.
	wantFile(t, f.path("b"), nil)
	if f.Cuts() != 1 {
		t.Fatalf("Cuts() = %d", f.Cuts())
	}
}

func TestPowerCutNames(t *testing.T) {
	f := mount(t)
	if err := os.Mkdir(f.path("d"), 0o750); err != nil {
		t.Fatal(err)
	}
	writeFile(t, f.path("d/kept"), []byte("kept"), true) // journal: d and d/kept durable
	writeFile(t, f.path("d/old"), []byte("old"), true)
	writeFile(t, f.path("d/gone"), []byte("created, no fsync of anything after"), false)
	if err := os.Remove(f.path("d/old")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(f.path("d/kept"), f.path("d/moved")); err != nil {
		t.Fatal(err)
	}
	cut(t, f)
	wantFile(t, f.path("d/kept"), []byte("kept"))
	wantFile(t, f.path("d/moved"), nil)
	wantFile(t, f.path("d/old"), []byte("old"))
	wantFile(t, f.path("d/gone"), nil)
	if st := f.Stats(); st.FilesDropped != 1 || st.NamesRestored != 2 {
		t.Fatalf("stats %+v, want 1 file dropped, 2 names restored", st)
	}
	if fi, err := os.Stat(f.path("d")); err != nil || fi.Mode().Perm() != 0o750 {
		t.Fatalf("d after the cut: %v %v", fi, err)
	}

	// Replace by rename, made durable by a directory fsync.
	writeFile(t, f.path("d/tmp"), []byte("new"), true)
	if err := os.Rename(f.path("d/tmp"), f.path("d/kept")); err != nil {
		t.Fatal(err)
	}
	syncDir(t, f.path("d"))
	if err := os.Rename(f.path("d/kept"), f.path("d/again")); err != nil {
		t.Fatal(err)
	}
	cut(t, f)
	wantFile(t, f.path("d/kept"), []byte("new"))
	wantFile(t, f.path("d/tmp"), nil)
	wantFile(t, f.path("d/again"), nil)
}

func TestPowerCutStrictNamesNeedDirectoryFsync(t *testing.T) {
	f := mount(t, strict)
	if err := os.Mkdir(f.path("d"), 0o755); err != nil {
		t.Fatal(err)
	}
	syncDir(t, f.Dir())
	writeFile(t, f.path("d/synced-data-only"), []byte("data"), true)
	writeFile(t, f.path("d/synced"), []byte("both"), true)
	syncDir(t, f.path("d"))
	writeFile(t, f.path("d/late"), []byte("late"), true)
	cut(t, f)
	wantFile(t, f.path("d/synced-data-only"), []byte("data")) // created before the dir fsync
	wantFile(t, f.path("d/synced"), []byte("both"))
	wantFile(t, f.path("d/late"), nil)

	// An unlink not followed by a directory fsync is undone even though a
	// file was fsynced since.
	if err := os.Remove(f.path("d/synced")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, f.path("d/synced-data-only"), []byte("data2"), true)
	cut(t, f)
	wantFile(t, f.path("d/synced"), []byte("both"))
	wantFile(t, f.path("d/synced-data-only"), []byte("data2"))
}

// TestPowerCutMmap writes through a shared mapping in another process: a
// page fault on a file served by this process would block a thread the Go
// runtime must stop for garbage collection while the server waits for it.
func TestPowerCutMmap(t *testing.T) {
	f := mount(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestMmapWriterProcess$")
	cmd.Env = append(os.Environ(), envMmapFile+"="+f.path("wal"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mmap writer: %v\n%s", err, out)
	}
	cut(t, f)
	want := make([]byte, mmapSize)
	copy(want, pattern(20000, 7))
	wantFile(t, f.path("wal"), want)
}

const (
	envMmapFile = "FAULTFS_TEST_MMAP_FILE"
	mmapSize    = 64 << 10
)

// TestMmapWriterProcess is TestPowerCutMmap's writer: it maps a new file,
// msyncs 20000 bytes, then writes more without msync and unmaps.
func TestMmapWriterProcess(t *testing.T) {
	p := os.Getenv(envMmapFile)
	if p == "" {
		t.Skip("run by TestPowerCutMmap")
	}
	fh, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if err := fh.Truncate(mmapSize); err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(fh.Fd()), 0, mmapSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	copy(m, pattern(20000, 7))
	if err := unix.Msync(m, unix.MS_SYNC); err != nil {
		t.Fatal(err)
	}
	copy(m[20000:], pattern(9000, 9)) // written back at munmap at the latest, never synced
	copy(m[100:], []byte("overwritten, not synced"))
	if err := unix.Munmap(m); err != nil {
		t.Fatal(err)
	}
}

func TestPowerCutFallocate(t *testing.T) {
	f := mount(t)
	data := pattern(3*pageSize, 3)
	writeFile(t, f.path("v"), data, true)
	fh, err := os.OpenFile(f.path("v"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if err := unix.Fallocate(int(fh.Fd()), 0, 0, 1<<20); err != nil {
		t.Fatal(err)
	}
	if fi, _ := fh.Stat(); fi.Size() != 1<<20 {
		t.Fatalf("size after fallocate %d", fi.Size())
	}
	if err := unix.Fallocate(int(fh.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, pageSize, pageSize); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	cut(t, f)
	wantFile(t, f.path("v"), data)
}

func TestInjectedErrorsReachTheWriter(t *testing.T) {
	f := mount(t)
	writeFile(t, f.path("x.vlog"), []byte("ok"), true)
	id := f.Inject(Rule{Op: OpWrite, Path: "*.vlog", Err: syscall.ENOSPC, After: 1, Count: 2})
	fh, err := os.OpenFile(f.path("x.vlog"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	var errs []error
	for i := range 4 {
		_, err := fh.WriteAt([]byte("abcd"), int64(i*4))
		errs = append(errs, err)
	}
	if errs[0] != nil || !errors.Is(errs[1], syscall.ENOSPC) || !errors.Is(errs[2], syscall.ENOSPC) || errs[3] != nil {
		t.Fatalf("write errors %v, want nil, ENOSPC, ENOSPC, nil", errs)
	}
	if got := f.Failed(id); got != 2 {
		t.Fatalf("Failed = %d, want 2", got)
	}
	writeFile(t, f.path("other"), []byte("not matched"), false)

	f.Inject(Rule{Op: OpFsync, Path: "x.vlog"})
	if err := fh.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("fsync: %v, want EIO", err)
	}
	f.Inject(Rule{Op: OpCreate, Path: "sub/*", Err: syscall.EROFS})
	if err := os.Mkdir(f.path("sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.path("sub/f"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("create: %v, want EROFS", err)
	}
	f.Inject(Rule{Op: OpRename, Path: "MANIFEST"})
	writeFile(t, f.path("MANIFEST-new"), nil, false)
	if err := os.Rename(f.path("MANIFEST-new"), f.path("MANIFEST")); !errors.Is(err, syscall.EIO) {
		t.Fatalf("rename: %v, want EIO", err)
	}
	f.ClearFaults()
	if err := fh.Sync(); err != nil {
		t.Fatalf("fsync after ClearFaults: %v", err)
	}
}

func TestTornWrite(t *testing.T) {
	f := mount(t)
	writeFile(t, f.path("log"), []byte("head:"), true)
	f.Inject(Rule{Op: OpWrite, Path: "log", Tear: 6, Count: 1})
	fh, err := os.OpenFile(f.path("log"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteAt([]byte("0123456789"), 5); !errors.Is(err, syscall.EIO) {
		t.Fatalf("torn write: %v, want EIO", err)
	}
	fh.Close()
	wantFile(t, f.path("log"), []byte("head:012345"))
	cut(t, f) // the prefix was never fsynced
	wantFile(t, f.path("log"), []byte("head:"))

	f.Inject(Rule{Op: OpWrite, Path: "log", Tear: 3, Count: 1, Persist: true})
	fh, err = os.OpenFile(f.path("log"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteAt([]byte("abcdef"), 5); !errors.Is(err, syscall.EIO) {
		t.Fatalf("torn write: %v, want EIO", err)
	}
	if _, err := fh.WriteAt([]byte("later"), 20); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	cut(t, f) // the persisted prefix survives, the later write does not
	wantFile(t, f.path("log"), []byte("head:abc"))
}

func TestFlockAndFsyncDelay(t *testing.T) {
	f := mount(t)
	writeFile(t, f.path("LOCK"), nil, true)
	a, err := os.Open(f.path("LOCK"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := os.Open(f.path("LOCK"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := unix.Flock(int(a.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(b.Fd()), unix.LOCK_EX|unix.LOCK_NB); !errors.Is(err, unix.EWOULDBLOCK) {
		t.Fatalf("second flock: %v, want EWOULDBLOCK", err)
	}
	if err := unix.Flock(int(a.Fd()), unix.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(b.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatalf("flock after unlock: %v", err)
	}

	f.SetFsyncDelay(30 * time.Millisecond)
	start := time.Now()
	writeFile(t, f.path("s"), []byte("x"), true)
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Fatalf("fsync took %v, want at least 30ms", d)
	}
}

func TestPowerCutRefusedWhileInUse(t *testing.T) {
	f := mount(t, func(o *Options) { o.UnmountWait = 300 * time.Millisecond })
	fh, err := os.Create(f.path("open"))
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if err := f.PowerCut(); err == nil {
		t.Fatal("PowerCut succeeded with a file open on the mount")
	}
}

func TestPowerCutJournalCommitsSizes(t *testing.T) {
	f := mount(t)
	fh, err := os.Create(f.path("00002.mem"))
	if err != nil {
		t.Fatal(err)
	}
	if err := fh.Truncate(3 * pageSize); err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteAt([]byte("unsynced"), 10); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	writeFile(t, f.path("other"), nil, true) // a journal commit
	cut(t, f)
	wantFile(t, f.path("00002.mem"), make([]byte, 3*pageSize))

	// Under Strict the size needs the file's own fsync.
	g := mount(t, strict)
	fh, err = os.Create(g.path("00002.mem"))
	if err != nil {
		t.Fatal(err)
	}
	if err := fh.Truncate(3 * pageSize); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	syncDir(t, g.Dir())
	cut(t, g)
	wantFile(t, g.path("00002.mem"), []byte{})
}

func TestFsyncCounts(t *testing.T) {
	f := mount(t)
	f.SetFsyncDelay(time.Millisecond)
	f.SetCleanFsyncFree(true)
	fh, err := os.OpenFile(f.path("c"), os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if _, err := fh.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	syncs, clean := f.Fsyncs(), f.CleanFsyncs()
	if err := fh.Sync(); err != nil { // a change to make durable
		t.Fatal(err)
	}
	if err := fh.Sync(); err != nil { // nothing left
		t.Fatal(err)
	}
	if got := f.Fsyncs() - syncs; got != 2 {
		t.Fatalf("Fsyncs counted %d fsyncs, want 2", got)
	}
	if got := f.CleanFsyncs() - clean; got != 1 {
		t.Fatalf("CleanFsyncs counted %d, want 1", got)
	}
}
