package faultfs

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"syscall"
)

// pageSize is the granularity of the pre-images kept for undoing writes.
const pageSize = 4096

// fileUndo is what it takes to bring one file back to its durable content:
// the durable size, the pre-image of every page below it changed since
// the last fsync (nil for a page of zeros), the size changes (truncate,
// fallocate) a journal commit made durable since, and the torn writes
// made durable on purpose, replayed after the rollback.
type fileUndo struct {
	durable int64
	pages   map[int64][]byte
	forced  []forcedWrite

	// low is the smallest size a committed truncation left since the
	// last fsync, size the last committed size: a rollback cuts the file
	// to low, then extends it with zeros to size.
	low, size int64
	// pendingLow and pendingSize are the same for size changes no commit
	// made durable yet; pendingSize is -1 without any.
	pendingLow, pendingSize int64
}

func newFileUndo(durable int64) *fileUndo {
	return &fileUndo{durable: durable, pages: map[int64][]byte{}, low: durable, size: durable,
		pendingLow: math.MaxInt64, pendingSize: -1}
}

// resized records a truncation or extension of the file to size.
func (fu *fileUndo) resized(size int64, truncation bool) {
	if truncation {
		fu.pendingLow = min(fu.pendingLow, size)
	}
	fu.pendingSize = size
}

// commitSize makes the size changes recorded so far durable.
func (fu *fileUndo) commitSize() {
	if fu.pendingSize < 0 {
		return
	}
	fu.low = min(fu.low, fu.pendingLow)
	fu.size = fu.pendingSize
	fu.pendingLow, fu.pendingSize = math.MaxInt64, -1
}

type forcedWrite struct {
	off  int64
	data []byte
}

// undoLog holds the fileUndo of every file changed since its last fsync,
// keyed by the backing inode number, and the bytes its pre-images take.
type undoLog struct {
	files map[uint64]*fileUndo
	bytes int64
	max   int64
}

func newUndoLog(max int64) *undoLog {
	return &undoLog{files: map[uint64]*fileUndo{}, max: max}
}

// created records a new, empty file: nothing of it is durable yet.
func (u *undoLog) created(ino uint64) {
	u.forget(ino)
	u.files[ino] = newFileUndo(0)
}

// forget drops what is kept for ino (it was fsynced, or it is gone).
func (u *undoLog) forget(ino uint64) {
	fu, ok := u.files[ino]
	if !ok {
		return
	}
	for _, p := range fu.pages {
		u.bytes -= int64(len(p))
	}
	delete(u.files, ino)
}

// synced makes the file's current content durable.
func (u *undoLog) synced(ino uint64) { u.forget(ino) }

// state returns the fileUndo of the file open at fd, creating it with the
// file's current size as durable if the file has not changed since its
// last fsync.
func (u *undoLog) state(ino uint64, fd int) (*fileUndo, error) {
	if fu, ok := u.files[ino]; ok {
		return fu, nil
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fstat: %w", err)
	}
	fu := newFileUndo(st.Size)
	u.files[ino] = fu
	return fu, nil
}

// save keeps the pre-image of every page of [off, end) below the durable
// size not kept yet. It must run before the range is changed.
func (u *undoLog) save(ino uint64, fd int, off, end int64) error {
	fu, err := u.state(ino, fd)
	if err != nil {
		return err
	}
	if end > fu.durable {
		end = fu.durable
	}
	if off >= end {
		return nil
	}
	var rd *os.File
	defer func() {
		if rd != nil {
			rd.Close()
		}
	}()
	buf := make([]byte, pageSize)
	for page := off / pageSize; page*pageSize < end; page++ {
		if _, ok := fu.pages[page]; ok {
			continue
		}
		n := min(int64(pageSize), fu.durable-page*pageSize)
		got, err := preadFull(fd, &rd, buf[:n], page*pageSize)
		if err != nil {
			return fmt.Errorf("read pre-image at %d: %w", page*pageSize, err)
		}
		clear(buf[got:n])
		if isZero(buf[:n]) {
			fu.pages[page] = nil
			continue
		}
		if u.max > 0 && u.bytes+n > u.max {
			return fmt.Errorf("undo log over %d bytes: %w", u.max, syscall.ENOSPC)
		}
		fu.pages[page] = append([]byte(nil), buf[:n]...)
		u.bytes += n
	}
	return nil
}

// commitSizes makes every recorded size change durable (a journal
// commit).
func (u *undoLog) commitSizes() {
	for _, fu := range u.files {
		fu.commitSize()
	}
}

// truncating keeps what truncating the file open at fd to size changes;
// it must run before the truncation.
func (u *undoLog) truncating(ino uint64, fd int, size int64) error {
	if err := u.save(ino, fd, size, math.MaxInt64); err != nil {
		return err
	}
	u.files[ino].resized(size, true)
	return nil
}

// extended records that fallocate extended the file open at fd to size.
func (u *undoLog) extended(ino uint64, fd int, size int64) error {
	fu, err := u.state(ino, fd)
	if err != nil {
		return err
	}
	fu.resized(size, false)
	return nil
}

// force records a torn write's prefix as durable.
func (u *undoLog) force(ino uint64, fd int, off int64, data []byte) error {
	fu, err := u.state(ino, fd)
	if err != nil {
		return err
	}
	fu.forced = append(fu.forced, forcedWrite{off: off, data: append([]byte(nil), data...)})
	return nil
}

// preadFull reads len(buf) bytes at off (fewer at the end of the file). A
// descriptor opened write-only is reopened for reading through /proc.
func preadFull(fd int, rd **os.File, buf []byte, off int64) (int, error) {
	src := fd
	if *rd != nil {
		src = int((*rd).Fd())
	}
	done := 0
	for done < len(buf) {
		n, err := syscall.Pread(src, buf[done:], off+int64(done))
		if errors.Is(err, syscall.EBADF) && *rd == nil {
			f, oerr := os.Open("/proc/self/fd/" + strconv.Itoa(fd))
			if oerr != nil {
				return done, fmt.Errorf("reopen for reading: %w", oerr)
			}
			*rd = f
			src = int(f.Fd())
			continue
		}
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return done, err
		}
		if n == 0 {
			break
		}
		done += n
	}
	return done, nil
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// rollback writes the pre-images back into the file at path, cuts it to
// its durable size and replays the forced writes.
func (fu *fileUndo) rollback(path string, keepPage func(page int64) bool) (undone int64, kept int, err error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return 0, 0, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	// Bytes past the final size are cut off; those between the durable
	// data and the final size (a committed extension) become zeros.
	keep := min(fu.durable, fu.low)
	undone += max(0, fi.Size()-fu.size) + max(0, min(fi.Size(), fu.size)-keep)
	pages := make([]int64, 0, len(fu.pages))
	for p := range fu.pages {
		pages = append(pages, p)
	}
	sort.Slice(pages, func(i, j int) bool { return pages[i] < pages[j] })
	zeros := make([]byte, pageSize)
	for _, p := range pages {
		if p*pageSize < fi.Size() && keepPage(p) {
			kept++
			continue
		}
		img := fu.pages[p]
		if img == nil {
			img = zeros[:min(int64(pageSize), fu.durable-p*pageSize)]
		}
		if _, err := f.WriteAt(img, p*pageSize); err != nil {
			return undone, kept, fmt.Errorf("restore %s at %d: %w", path, p*pageSize, err)
		}
		undone += int64(len(img))
	}
	for _, size := range []int64{min(fu.durable, fu.low), fu.size} {
		if err := f.Truncate(size); err != nil {
			return undone, kept, fmt.Errorf("truncate %s to %d: %w", path, size, err)
		}
	}
	for _, w := range fu.forced {
		if _, err := f.WriteAt(w.data, w.off); err != nil {
			return undone, kept, fmt.Errorf("replay torn write to %s at %d: %w", path, w.off, err)
		}
	}
	return undone, kept, nil
}
