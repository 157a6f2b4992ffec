package buffer

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
)

// ballastName is a file in the data directory that holds disk space in
// reserve for Badger: when another program fills the disk, the buffer
// deletes it, so that Badger can still open (it allocates a write-ahead
// log and a value log file at open), take the uplink's deletions and
// compact them away, which is what frees the disk again. It is made again
// once free space allows.
const ballastName = "GATEWAY-BALLAST"

// ballastSize is the ballast's size for a memtable of memTableSize bytes:
// what Badger allocates at open (a write-ahead log of twice the memtable
// and a value log file), twice over: 12 memtables, 96 MiB with the default memtable.
func ballastSize(memTableSize int64) int64 {
	return 2 * (2*memTableSize + 2*valueLogFileSize(memTableSize))
}

// ballast keeps the reserve file of one data directory.
type ballast struct {
	path   string
	size   int64
	logger *slog.Logger
}

func newBallast(dir string, memTableSize int64, logger *slog.Logger) ballast {
	return ballast{path: filepath.Join(dir, ballastName), size: ballastSize(memTableSize), logger: logger}
}

// exists reports whether the ballast file is there.
func (b ballast) exists() bool {
	_, err := os.Stat(b.path)
	return err == nil
}

// keep deletes the ballast when free space (free bytes, known) is under
// its size, and makes it when free space is at least minFree plus its
// size: the reserve never takes space the buffer's watermark counts on.
func (b ballast) keep(free uint64, known bool, minFree int64) {
	if !known {
		return
	}
	switch have := b.exists(); {
	case have && free < uint64(b.size):
		if err := os.Remove(b.path); err != nil {
			b.logger.Error("the disk is full and the ballast cannot be deleted", "path", b.path, "err", err)
			return
		}
		b.logger.Warn("the disk is full: deleted the ballast so that the buffer can open, drain and compact; "+
			"it is made again when space returns", "path", b.path, "ballast_bytes", b.size, "free_bytes", free)
	case !have && free >= uint64(minFree+b.size):
		if err := b.make(); err != nil {
			b.logger.Warn("making the ballast", "path", b.path, "err", err)
		}
	}
}

// make allocates the ballast (fallocate: its blocks are taken, not a
// sparse file) under a temporary name and renames it into place.
func (b ballast) make() error {
	tmp := b.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = syscall.Fallocate(int(f.Fd()), 0, 0, b.size)
	if errors.Is(err, syscall.EOPNOTSUPP) {
		err = writeZeros(f, b.size)
	}
	err = errors.Join(err, f.Sync(), f.Close())
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("allocating %d bytes: %w", b.size, err)
	}
	return os.Rename(tmp, b.path)
}

// writeZeros fills f with n zero bytes (file systems without fallocate).
func writeZeros(f *os.File, n int64) error {
	chunk := make([]byte, 1<<20)
	for n > 0 {
		k := min(n, int64(len(chunk)))
		if _, err := f.Write(chunk[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}
