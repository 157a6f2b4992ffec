// Package faultfs is a fault-injecting FUSE file system for tests, in the
// spirit of LazyFS: a passthrough over a backing directory that remembers
// what has not been made durable, so that a test can simulate a power cut,
// return ENOSPC or EIO on chosen operations, tear a write and slow fsync
// down.
//
// # Durability model
//
// Writes, truncations and namespace changes go to the backing directory at
// once (reads see them, as they would see the page cache); faultfs keeps
// what it needs to undo them. PowerCut unmounts the file system (every
// process using it must have exited: the kernel keeps no file open on it),
// rolls the backing directory back to its durable state and mounts it
// again. The durable state is:
//
//   - File data: the content and size a file had when it was last fsynced
//     (fsync, fdatasync and msync with MS_SYNC all arrive as FUSE fsync;
//     data and size are made durable alike). A write, truncation,
//     fallocate hole punch or O_TRUNC since then is undone; a file created
//     since has size 0 until its first fsync. Pre-images are kept in memory
//     page by page (4 KiB), only for pages below the durable size that
//     changed since the last fsync, and a page of zeros costs no copy;
//     their total is capped by Options.MaxUndoBytes (ENOSPC beyond it).
//   - Sizes set by truncate, ftruncate or a size-changing fallocate are
//     metadata: under Journaled any later fsync (of any file or directory)
//     makes them durable, as ext4 journals i_size with the commit, while
//     the data written since stays undone (a file extended by ftruncate
//     and never fsynced comes back at its new size, full of zeros). A size
//     grown by writing past the end is data: only the file's own fsync
//     makes it durable (ext4's delayed allocation).
//   - Names (create, mkdir, unlink, rmdir, rename, link, symlink): with
//     Journaled (the default, like ext4 or xfs with a metadata journal) any
//     fsync of a file or a directory makes every name change made before it
//     durable, as a journal commit does; with Strict (the POSIX minimum)
//     only an fsync of a directory makes that directory's entries durable.
//     A name change that is not durable is undone: a created file vanishes,
//     an unlinked or overwritten file comes back (faultfs keeps it aside
//     until its removal is durable), a rename is reverted. Names are tracked
//     by path: renaming a directory is not modelled beyond moving the paths
//     below it. A periodic journal commit (ext4's commit=5) is not
//     simulated, so the model is the worst a disk that honours flushes may
//     show.
//   - Directories are recreated with their mode; ownership, times and
//     extended attributes are not part of the model.
//
// Writes through a shared mapping reach faultfs as writes when the kernel
// writes the pages back (msync, munmap, memory pressure, the end of the
// process), so what a process wrote through mmap and did not msync is
// lost like any other unsynced write. A Go process must not touch a mapping
// of a file it serves itself: a thread blocked in a page fault cannot stop
// for the garbage collector while the server goroutines wait for it, so
// tests run mmap users (Badger in gatewayd) in another process. flock and POSIX locks are passed to
// the backing files. Passthrough to the kernel (FUSE backing files) is off,
// so that every write goes through faultfs.
//
// # Faults
//
// Inject adds a Rule: an operation (write, fsync, create, ...), a path
// pattern, an error, how many matching calls to let through first and how
// many to fail. A write rule with Tear set writes only a prefix of the
// matching write to the backing file and fails the call; with Persist the
// prefix also survives a power cut, as a sector the disk wrote before the
// power went. SetFsyncDelay makes every fsync take at least that long.
package faultfs
