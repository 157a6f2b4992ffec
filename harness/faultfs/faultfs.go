package faultfs

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// ErrUnavailable wraps every reason FUSE cannot be mounted here (no
// /dev/fuse, no permission, mount refused).
var ErrUnavailable = errors.New("faultfs: FUSE unavailable")

// NameModel says which fsync makes a name change durable.
type NameModel int

const (
	// Journaled: any fsync makes every earlier name change durable (a
	// journal commit, as on ext4 or xfs).
	Journaled NameModel = iota
	// Strict: only an fsync of a directory makes its entries durable.
	Strict
)

// Options configure a file system.
type Options struct {
	// Backing is the directory served; it must exist.
	Backing string
	// Mountpoint is where it is mounted; it must exist.
	Mountpoint string
	// Names is the name model; Journaled by default.
	Names NameModel
	// MaxUndoBytes bounds the pre-images kept for unsynced changes
	// (default 512 MiB); a write beyond it fails with ENOSPC.
	MaxUndoBytes int64
	// FsyncDelay is how long every fsync takes at least.
	FsyncDelay time.Duration
	// UnmountWait is how long PowerCut and Unmount retry a busy mount
	// (default 10s).
	UnmountWait time.Duration
}

// FS is a mounted fault-injecting file system.
type FS struct {
	opts     Options
	stateDir string // next to Backing: graveyard/ and stage/

	ctl    sync.Mutex // serialises mount, PowerCut and Unmount
	server *fuse.Server

	mu         sync.Mutex
	undo       *undoLog
	cur        names           // the tree as it is
	durable    names           // the tree a power cut leaves
	namesDirty bool            // cur differs from durable (Journaled)
	graveyard  map[uint64]bool // removed files kept for a power cut
	rules      []*rule
	nextRule   int
	fsyncDelay time.Duration
	// cleanFsyncFree exempts clean fsyncs from fsyncDelay.
	cleanFsyncFree bool
	stats          Stats
	// fsyncs counts fsync and fsyncdir calls (Fsyncs), cleanFsyncs those
	// that found nothing to make durable (CleanFsyncs).
	fsyncs, cleanFsyncs atomic.Int64
}

// Stats counts what power cuts undid.
type Stats struct {
	Cuts          int   // power cuts made
	FilesRolled   int   // files whose content or size was rolled back
	BytesUndone   int64 // bytes of pre-images written back, cut off or zeroed
	PagesKept     int   // unsynced pages a torn cut kept
	FilesDropped  int   // files whose name was not durable, deleted
	NamesRestored int   // removed or renamed files brought back
}

// Start mounts opts.Backing at opts.Mountpoint. Everything in Backing at
// that moment is durable. An error wrapping ErrUnavailable means FUSE
// cannot be used on this machine.
func Start(opts Options) (*FS, error) {
	if opts.MaxUndoBytes == 0 {
		opts.MaxUndoBytes = 512 << 20
	}
	if opts.UnmountWait == 0 {
		opts.UnmountWait = 10 * time.Second
	}
	backing, err := filepath.Abs(opts.Backing)
	if err != nil {
		return nil, fmt.Errorf("faultfs: backing %q: %w", opts.Backing, err)
	}
	opts.Backing = backing
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	f := &FS{
		opts:       opts,
		stateDir:   filepath.Join(filepath.Dir(backing), "."+filepath.Base(backing)+".faultfs"),
		undo:       newUndoLog(opts.MaxUndoBytes),
		graveyard:  map[uint64]bool{},
		fsyncDelay: opts.FsyncDelay,
	}
	if err := f.resetState(); err != nil {
		return nil, err
	}
	if err := f.mount(); err != nil {
		return nil, err
	}
	return f, nil
}

// Dir is the mount point.
func (f *FS) Dir() string { return f.opts.Mountpoint }

// Fsyncs is how many fsync and fsyncdir calls the file system has served
// (failed ones included), e.g. to relate a benchmark's commits to its
// syncs.
func (f *FS) Fsyncs() int64 { return f.fsyncs.Load() }

// CleanFsyncs is how many of the Fsyncs found nothing to make durable when
// called: no change to the file since its last fsync and no name change
// (for an fsyncdir: none anywhere). A real disk serves those without
// writing data; faultfs delays them like any other unless
// SetCleanFsyncFree.
func (f *FS) CleanFsyncs() int64 { return f.cleanFsyncs.Load() }

// Cuts is how many power cuts have been made.
func (f *FS) Cuts() int { return f.Stats().Cuts }

// Stats returns what the power cuts so far undid.
func (f *FS) Stats() Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stats
}

// resetState makes the backing tree as it is the durable state.
func (f *FS) resetState() error {
	for _, d := range []string{f.graveyardDir(), f.stageDir()} {
		if err := os.RemoveAll(d); err != nil {
			return fmt.Errorf("faultfs: clear %s: %w", d, err)
		}
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("faultfs: create %s: %w", d, err)
		}
	}
	cur, err := walkNames(f.opts.Backing)
	if err != nil {
		return fmt.Errorf("faultfs: %w", err)
	}
	f.cur, f.durable, f.namesDirty = cur, cur.clone(), false
	f.undo = newUndoLog(f.opts.MaxUndoBytes)
	f.graveyard = map[uint64]bool{}
	return nil
}

func (f *FS) graveyardDir() string { return filepath.Join(f.stateDir, "graveyard") }
func (f *FS) stageDir() string     { return filepath.Join(f.stateDir, "stage") }

func (f *FS) mount() error {
	var st syscall.Stat_t
	if err := syscall.Stat(f.opts.Backing, &st); err != nil {
		return fmt.Errorf("faultfs: backing %s: %w", f.opts.Backing, err)
	}
	root := &node{ffs: f}
	root.RootData = &fs.LoopbackRoot{Path: f.opts.Backing, Dev: uint64(st.Dev), NewNode: f.newNode, RootNode: root}
	zero := time.Duration(0)
	server, err := fs.Mount(f.opts.Mountpoint, root, &fs.Options{
		EntryTimeout:    &zero,
		AttrTimeout:     &zero,
		NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{
			DirectMount: true,
			FsName:      "faultfs",
			Name:        "faultfs",
		},
	})
	if err != nil {
		return fmt.Errorf("%w: mount %s at %s: %v", ErrUnavailable, f.opts.Backing, f.opts.Mountpoint, err)
	}
	f.server = server
	return nil
}

func (f *FS) newNode(r *fs.LoopbackRoot, _ *fs.Inode, _ string, _ *syscall.Stat_t) fs.InodeEmbedder {
	return &node{LoopbackNode: fs.LoopbackNode{RootData: r}, ffs: f}
}

// unmount unmounts, retrying while the kernel still releases the files of
// a process that just died.
func (f *FS) unmount() error {
	if f.server == nil {
		return nil
	}
	deadline := time.Now().Add(f.opts.UnmountWait)
	for {
		err := f.server.Unmount()
		if err == nil {
			f.server.Wait()
			f.server = nil
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("faultfs: unmount %s (is a process still using it?): %w", f.opts.Mountpoint, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Unmount unmounts the file system, leaving the backing directory as it
// is (unsynced changes included).
func (f *FS) Unmount() error {
	f.ctl.Lock()
	defer f.ctl.Unlock()
	return f.unmount()
}

// PowerCut simulates losing power: it unmounts (every process using the
// file system must have exited), rolls the backing directory back to what
// was durable (see the package documentation) and mounts it again.
func (f *FS) PowerCut() error {
	return f.powerCut(func(int64) bool { return false })
}

// PowerCutTorn is PowerCut with a power failure during writeback: each
// page (4 KiB) overwritten since its file's last fsync, below the durable
// size, keeps its new content with probability keep (drawn from seed), as
// the kernel may have written any subset of dirty pages before the power
// went. Data past the durable size is still lost.
func (f *FS) PowerCutTorn(keep float64, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 0x7f5))
	return f.powerCut(func(int64) bool { return rng.Float64() < keep })
}

func (f *FS) powerCut(keepPage func(page int64) bool) error {
	f.ctl.Lock()
	defer f.ctl.Unlock()
	if err := f.unmount(); err != nil {
		return err
	}
	f.mu.Lock()
	err := f.rollback(keepPage)
	if err == nil {
		err = f.resetState()
	}
	f.stats.Cuts++
	f.mu.Unlock()
	if err != nil {
		return fmt.Errorf("faultfs: power cut: %w", err)
	}
	return f.mount()
}

// Inject adds a fault rule and returns its id (for Remove).
func (f *FS) Inject(r Rule) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextRule++
	f.rules = append(f.rules, &rule{Rule: r, id: f.nextRule})
	return f.nextRule
}

// Remove deletes the rule with id.
func (f *FS) Remove(id int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, r := range f.rules {
		if r.id == id {
			f.rules = append(f.rules[:i], f.rules[i+1:]...)
			return
		}
	}
}

// ClearFaults removes every rule.
func (f *FS) ClearFaults() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = nil
}

// Failed is how many calls the rule with id has failed.
func (f *FS) Failed(id int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.rules {
		if r.id == id {
			return r.failed
		}
	}
	return 0
}

// SetCleanFsyncFree(true) exempts later clean fsyncs (see CleanFsyncs) from
// the fsync delay, as a disk with nothing to write answers at once.
func (f *FS) SetCleanFsyncFree(free bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cleanFsyncFree = free
}

// SetFsyncDelay makes every later fsync take at least d.
func (f *FS) SetFsyncDelay(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fsyncDelay = d
}

// faultLocked returns the first rule failing this call, if any.
func (f *FS) faultLocked(op Op, paths ...string) *rule {
	for _, r := range f.rules {
		for _, p := range paths {
			if r.matches(op, p) {
				if r.fire() {
					return r
				}
				break
			}
		}
	}
	return nil
}

// fault is faultLocked taking the lock; it returns the rule's errno or 0.
func (f *FS) fault(op Op, paths ...string) syscall.Errno {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.faultLocked(op, paths...); r != nil {
		return r.errno()
	}
	return 0
}
