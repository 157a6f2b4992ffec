package faultfs

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// node is a loopback node whose changes faultfs records and can fail.
type node struct {
	fs.LoopbackNode
	ffs *FS
}

var (
	_ fs.NodeCreater        = (*node)(nil)
	_ fs.NodeOpener         = (*node)(nil)
	_ fs.NodeMkdirer        = (*node)(nil)
	_ fs.NodeMknoder        = (*node)(nil)
	_ fs.NodeSymlinker      = (*node)(nil)
	_ fs.NodeLinker         = (*node)(nil)
	_ fs.NodeUnlinker       = (*node)(nil)
	_ fs.NodeRmdirer        = (*node)(nil)
	_ fs.NodeRenamer        = (*node)(nil)
	_ fs.NodeSetattrer      = (*node)(nil)
	_ fs.NodeOpendirHandler = (*node)(nil)
)

// rel is the node's path relative to the root ("" for the root).
func (n *node) rel() string {
	p := strings.Trim(n.Path(n.Root()), "/")
	if p == "." {
		return ""
	}
	return p
}

func (n *node) child(name string) string { return filepath.Join(n.rel(), name) }

func (f *FS) backing(rel string) string { return filepath.Join(f.opts.Backing, rel) }

// addNameLocked records a new name in the current tree.
func (f *FS) addNameLocked(rel string) {
	if e, err := lstatEntry(f.backing(rel)); err == nil {
		f.cur[rel] = e
		f.namesDirty = true
	}
}

// removeFileLocked removes the file at rel, keeping it in the graveyard
// while a durable name still refers to it.
func (f *FS) removeFileLocked(rel string) syscall.Errno {
	p := f.backing(rel)
	e, err := lstatEntry(p)
	if err != nil {
		return fs.ToErrno(err)
	}
	if e.isDir() {
		return syscall.EISDIR
	}
	if f.durable.references(e.ino) && !f.graveyard[e.ino] {
		err = os.Rename(p, filepath.Join(f.graveyardDir(), strconv.FormatUint(e.ino, 10)))
		if err == nil {
			f.graveyard[e.ino] = true
		}
	} else {
		err = syscall.Unlink(p)
	}
	if err != nil {
		return fs.ToErrno(err)
	}
	delete(f.cur, rel)
	f.namesDirty = true
	if !f.graveyard[e.ino] && !f.cur.references(e.ino) {
		f.undo.forget(e.ino)
	}
	return 0
}

// commitNamesLocked makes the name changes an fsync of dir (or of a file,
// isDir false) makes durable, under Journaled with every size change
// (truncate, fallocate), and drops the removed files no durable name
// refers to any longer.
func (f *FS) commitNamesLocked(dir string, isDir bool) {
	switch {
	case f.opts.Names == Journaled:
		f.undo.commitSizes()
		if !f.namesDirty {
			return
		}
		f.durable = f.cur.clone()
		f.namesDirty = false
	case isDir:
		f.durable.syncDir(dir, f.cur)
	default:
		return
	}
	for ino := range f.graveyard {
		if f.durable.references(ino) {
			continue
		}
		_ = os.Remove(filepath.Join(f.graveyardDir(), strconv.FormatUint(ino, 10)))
		delete(f.graveyard, ino)
		if !f.cur.references(ino) {
			f.undo.forget(ino)
		}
	}
}

// truncatingPathLocked keeps what truncating the file at p to size changes.
func (f *FS) truncatingPathLocked(p string, size int64) syscall.Errno {
	fd, err := syscall.Open(p, syscall.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return fs.ToErrno(err)
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return fs.ToErrno(err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return 0
	}
	return toErrno(f.undo.truncating(st.Ino, fd, size))
}

func toErrno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	return fs.ToErrno(err)
}

// sleepFsync counts an fsync and waits the configured fsync delay; clean
// reports, with mu held, whether the fsync has nothing to make durable.
func (f *FS) sleepFsync(clean func() bool) {
	f.fsyncs.Add(1)
	f.mu.Lock()
	d := f.fsyncDelay
	if clean() {
		f.cleanFsyncs.Add(1)
		if f.cleanFsyncFree {
			d = 0
		}
	}
	f.mu.Unlock()
	if d > 0 {
		time.Sleep(d)
	}
}

func (n *node) wrap(fh fs.FileHandle) (fs.FileHandle, syscall.Errno) {
	lf, ok := fh.(*fs.LoopbackFile)
	if !ok {
		return fh, 0
	}
	fd, _ := lf.PassthroughFd()
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		lf.Release(context.Background())
		return nil, fs.ToErrno(err)
	}
	return &file{LoopbackFile: lf, n: n, fd: fd, ino: st.Ino}, 0
}

// Create creates a file; a new one has nothing durable yet.
func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	f, rel := n.ffs, n.child(name)
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.faultLocked(OpCreate, rel); r != nil {
		return nil, nil, 0, r.errno()
	}
	_, statErr := os.Lstat(f.backing(rel))
	existed := statErr == nil
	if existed && flags&syscall.O_TRUNC != 0 {
		if errno := f.truncatingPathLocked(f.backing(rel), 0); errno != 0 {
			return nil, nil, 0, errno
		}
	}
	ch, fh, fuseFlags, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	wrapped, errno := ch.Operations().(*node).wrap(fh)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	if !existed {
		f.undo.created(wrapped.(*file).ino)
		f.addNameLocked(rel)
	}
	return ch, wrapped, fuseFlags, 0
}

// Open opens an existing file.
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	f, rel := n.ffs, n.rel()
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.faultLocked(OpOpen, rel); r != nil {
		return nil, 0, r.errno()
	}
	if flags&syscall.O_TRUNC != 0 {
		if r := f.faultLocked(OpTruncate, rel); r != nil {
			return nil, 0, r.errno()
		}
		if errno := f.truncatingPathLocked(f.backing(rel), 0); errno != 0 {
			return nil, 0, errno
		}
	}
	fh, fuseFlags, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	wrapped, errno := n.wrap(fh)
	return wrapped, fuseFlags, errno
}

// created runs create, a loopback operation making a new name, under the
// create fault rules and records the name.
func (n *node) created(name string, create func() (*fs.Inode, syscall.Errno)) (*fs.Inode, syscall.Errno) {
	f, rel := n.ffs, n.child(name)
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.faultLocked(OpCreate, rel); r != nil {
		return nil, r.errno()
	}
	ch, errno := create()
	if errno == 0 {
		f.addNameLocked(rel)
	}
	return ch, errno
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.created(name, func() (*fs.Inode, syscall.Errno) { return n.LoopbackNode.Mkdir(ctx, name, mode, out) })
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.created(name, func() (*fs.Inode, syscall.Errno) { return n.LoopbackNode.Mknod(ctx, name, mode, rdev, out) })
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.created(name, func() (*fs.Inode, syscall.Errno) { return n.LoopbackNode.Symlink(ctx, target, name, out) })
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.created(name, func() (*fs.Inode, syscall.Errno) { return n.LoopbackNode.Link(ctx, target, name, out) })
}

// Unlink removes a name; the file stays recoverable until that is durable.
func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	f, rel := n.ffs, n.child(name)
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.faultLocked(OpUnlink, rel); r != nil {
		return r.errno()
	}
	return f.removeFileLocked(rel)
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	f, rel := n.ffs, n.child(name)
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.faultLocked(OpUnlink, rel); r != nil {
		return r.errno()
	}
	if errno := n.LoopbackNode.Rmdir(ctx, name); errno != 0 {
		return errno
	}
	f.cur.remove(rel)
	f.namesDirty = true
	return 0
}

// Rename renames; a file it replaces is removed as by Unlink.
func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	if flags&^unix.RENAME_NOREPLACE != 0 {
		return syscall.EINVAL
	}
	f, from, to := n.ffs, n.child(name), np.child(newName)
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.faultLocked(OpRename, from, to); r != nil {
		return r.errno()
	}
	src, err := lstatEntry(f.backing(from))
	if err != nil {
		return fs.ToErrno(err)
	}
	if dst, err := lstatEntry(f.backing(to)); err == nil {
		switch {
		case flags&unix.RENAME_NOREPLACE != 0:
			return syscall.EEXIST
		case dst.isDir() != src.isDir():
			if dst.isDir() {
				return syscall.EISDIR
			}
			return syscall.ENOTDIR
		case !dst.isDir() && dst.ino != src.ino:
			if errno := f.removeFileLocked(to); errno != 0 {
				return errno
			}
		}
	}
	if errno := n.LoopbackNode.Rename(ctx, name, newParent, newName, 0); errno != 0 {
		return errno
	}
	f.cur.remove(to)
	f.cur.move(from, to)
	f.namesDirty = true
	return 0
}

// Setattr keeps what a truncation cuts off before it does.
func (n *node) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	f, rel := n.ffs, n.rel()
	f.mu.Lock()
	defer f.mu.Unlock()
	if size, ok := in.GetSize(); ok {
		if r := f.faultLocked(OpTruncate, rel); r != nil {
			return r.errno()
		}
		var errno syscall.Errno
		if ff, ok := fh.(*file); ok {
			errno = toErrno(f.undo.truncating(ff.ino, ff.fd, int64(size)))
		} else {
			errno = f.truncatingPathLocked(f.backing(rel), int64(size))
		}
		if errno != 0 {
			return errno
		}
	}
	return n.LoopbackNode.Setattr(ctx, fh, in, out)
}

// OpendirHandle opens a directory whose fsync commits names.
func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fuseFlags, errno := n.LoopbackNode.OpendirHandle(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	return &dirHandle{inner: fh, n: n}, fuseFlags, 0
}

// dirHandle is an open directory.
type dirHandle struct {
	inner fs.FileHandle
	n     *node
}

var (
	_ fs.FileReaddirenter = (*dirHandle)(nil)
	_ fs.FileReleasedirer = (*dirHandle)(nil)
	_ fs.FileSeekdirer    = (*dirHandle)(nil)
	_ fs.FileFsyncdirer   = (*dirHandle)(nil)
)

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	return d.inner.(fs.FileReaddirenter).Readdirent(ctx)
}

func (d *dirHandle) Releasedir(ctx context.Context, releaseFlags uint32) {
	if r, ok := d.inner.(fs.FileReleasedirer); ok {
		r.Releasedir(ctx, releaseFlags)
	}
}

func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	if s, ok := d.inner.(fs.FileSeekdirer); ok {
		return s.Seekdir(ctx, off)
	}
	return syscall.ENOTSUP
}

// Fsyncdir makes the directory's entries durable (every name change under
// Journaled).
func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	f, rel := d.n.ffs, d.n.rel()
	f.sleepFsync(func() bool { return !f.namesDirty })
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.faultLocked(OpFsync, rel); r != nil {
		return r.errno()
	}
	f.commitNamesLocked(rel, true)
	return 0
}

// file is an open regular file whose writes faultfs can undo and fail.
type file struct {
	*fs.LoopbackFile
	n   *node
	fd  int
	ino uint64
}

// PassthroughFd refuses kernel passthrough, which would bypass faultfs.
func (f *file) PassthroughFd() (int, bool) { return -1, false }

func (f *file) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if errno := f.n.ffs.fault(OpRead, f.n.rel()); errno != 0 {
		return nil, errno
	}
	return f.LoopbackFile.Read(ctx, buf, off)
}

func (f *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	return f.write(data, off)
}

func (f *file) Writev(ctx context.Context, iov [][]byte, off int64) (uint32, syscall.Errno) {
	var data []byte
	for _, b := range iov {
		data = append(data, b...)
	}
	return f.write(data, off)
}

func (f *file) write(data []byte, off int64) (uint32, syscall.Errno) {
	ffs := f.n.ffs
	ffs.mu.Lock()
	defer ffs.mu.Unlock()
	r := ffs.faultLocked(OpWrite, f.n.rel())
	if r != nil && r.Tear <= 0 {
		return 0, r.errno()
	}
	if err := ffs.undo.save(f.ino, f.fd, off, off+int64(len(data))); err != nil {
		return 0, toErrno(err)
	}
	if r != nil {
		return 0, f.tear(r, data, off)
	}
	n, err := pwriteFull(f.fd, data, off)
	return uint32(n), toErrno(err)
}

// tear writes the rule's prefix of data and returns the rule's error.
func (f *file) tear(r *rule, data []byte, off int64) syscall.Errno {
	prefix := data[:min(r.Tear, len(data))]
	if _, err := pwriteFull(f.fd, prefix, off); err != nil {
		return toErrno(err)
	}
	if r.Persist {
		if err := f.n.ffs.undo.force(f.ino, f.fd, off, prefix); err != nil {
			return toErrno(err)
		}
	}
	return r.errno()
}

func pwriteFull(fd int, data []byte, off int64) (int, error) {
	done := 0
	for done < len(data) {
		n, err := syscall.Pwrite(fd, data[done:], off+int64(done))
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return done, err
		}
		done += n
	}
	return done, nil
}

// Fsync makes the file's content durable (and, under Journaled, every
// name change). The backing file is not synced: only the model matters.
func (f *file) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	ffs := f.n.ffs
	ffs.sleepFsync(func() bool {
		_, dirty := ffs.undo.files[f.ino]
		return !dirty && !ffs.namesDirty
	})
	ffs.mu.Lock()
	defer ffs.mu.Unlock()
	if r := ffs.faultLocked(OpFsync, f.n.rel()); r != nil {
		return r.errno()
	}
	ffs.undo.synced(f.ino)
	ffs.commitNamesLocked("", false)
	return 0
}

// Allocate keeps what a hole punch or zeroing overwrites.
func (f *file) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	ffs := f.n.ffs
	ffs.mu.Lock()
	defer ffs.mu.Unlock()
	if r := ffs.faultLocked(OpFallocate, f.n.rel()); r != nil {
		return r.errno()
	}
	if mode&(unix.FALLOC_FL_COLLAPSE_RANGE|unix.FALLOC_FL_INSERT_RANGE) != 0 {
		return syscall.EOPNOTSUPP
	}
	if _, err := ffs.undo.state(f.ino, f.fd); err != nil { // the size before it grows
		return toErrno(err)
	}
	if mode&(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_ZERO_RANGE) != 0 {
		if err := ffs.undo.save(f.ino, f.fd, int64(off), int64(off+size)); err != nil {
			return toErrno(err)
		}
	}
	var before, after syscall.Stat_t
	if err := syscall.Fstat(f.fd, &before); err != nil {
		return fs.ToErrno(err)
	}
	if errno := f.LoopbackFile.Allocate(ctx, off, size, mode); errno != 0 {
		return errno
	}
	if err := syscall.Fstat(f.fd, &after); err != nil {
		return fs.ToErrno(err)
	}
	if after.Size == before.Size {
		return 0
	}
	return toErrno(ffs.undo.extended(f.ino, f.fd, after.Size))
}
