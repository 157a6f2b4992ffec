package buffer

import (
	"syscall"
)

// Space is the buffer's disk budget and its file system's free space, as
// operators see them (the status page).
type Space struct {
	// UsedBytes is what the budget counts now (Usage().Total()).
	UsedBytes int64
	// BudgetBytes is Options.MaxPendingBytes, defaults applied.
	BudgetBytes int64
	// FreeBytes is the free space of the data directory's file system;
	// FreeKnown is false when it could not be read (FreeBytes is 0 then).
	FreeBytes uint64
	FreeKnown bool
	// MinFreeBytes is the free-space watermark, Options.MinFreeBytes with
	// defaults applied.
	MinFreeBytes int64
}

// Space returns the budget in use and the free space now. It reads the
// file system's statistics (one statfs).
func (b *Buffer) Space() Space {
	free, ok := b.free.bytes()
	return Space{UsedBytes: b.usage.total(), BudgetBytes: b.opts.MaxPendingBytes,
		FreeBytes: free, FreeKnown: ok, MinFreeBytes: b.opts.MinFreeBytes}
}

// freeSpace reads the data directory's free bytes. It is called once per
// group commit: a statfs costs about a microsecond, far less than the
// group's fsync, and a cached value could let a burst overrun the
// watermark.
type freeSpace struct {
	dir      string
	override func() (uint64, bool)
}

func (f *freeSpace) bytes() (uint64, bool) {
	if f.override != nil {
		return f.override()
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(f.dir, &st); err != nil {
		return 0, false
	}
	return uint64(st.Bavail) * uint64(st.Bsize), true
}
