package buffer

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
)

// ErrFailed is returned (wrapped, with the cause) by every write once a
// write to the data directory failed (EIO, EROFS, EACCES, ENOSPC where
// Badger could not make room): see failure.
var ErrFailed = errors.New("buffer: the data directory failed")

// failure records the first failed write of Badger's. After one, Badger's
// state is not safe to use: a write-ahead log that could not be created
// leaves it without a memtable, and its next write or read crashes the
// process. So the buffer refuses every later write, without calling
// Badger, acknowledges nothing more (the batches of the failed write were
// not acknowledged either), and says so on Failed: gatewayd exits, and
// systemd starts it again, which replays what is on disk.
type failure struct {
	logger *slog.Logger
	dir    string
	once   sync.Once
	done   chan struct{}
	err    error // set before done is closed
	// inject, when set, stands for Badger's commit in tests: its error
	// fails the commit.
	inject func() error
}

func newFailure(dir string, logger *slog.Logger, inject func() error) *failure {
	return &failure{dir: dir, logger: logger, done: make(chan struct{}), inject: inject}
}

// injected returns the injected commit error, if any.
func (f *failure) injected() error {
	if f.inject == nil {
		return nil
	}
	return f.inject()
}

// fail records err as the failure, the first time.
func (f *failure) fail(err error) {
	f.once.Do(func() {
		f.err = fmt.Errorf("%w %s: %w", ErrFailed, f.dir, err)
		f.logger.Error("a write to the data directory failed: no batch is acknowledged from now on, and gatewayd "+
			"stops so that it starts again on what is on disk (nothing acknowledged is lost)",
			"dir", f.dir, "err", err)
		close(f.done)
	})
}

// failed returns the failure, or nil.
func (f *failure) failed() error {
	select {
	case <-f.done:
		return f.err
	default:
		return nil
	}
}

// Failed is closed when a write to the data directory failed; Err then
// says how.
func (b *Buffer) Failed() <-chan struct{} { return b.failure.done }

// Err returns the failure of the data directory, or nil.
func (b *Buffer) Err() error { return b.failure.failed() }
