package faultfs

import (
	"path/filepath"
	"strings"
	"syscall"
)

// Op is a kind of operation a Rule applies to.
type Op string

// The operations a Rule can fail.
const (
	OpWrite     Op = "write"     // write, including writeback of mapped pages
	OpRead      Op = "read"      // read
	OpFsync     Op = "fsync"     // fsync, fdatasync, msync of files and directories
	OpCreate    Op = "create"    // create, mkdir, mknod, symlink, link
	OpOpen      Op = "open"      // open of an existing file
	OpFallocate Op = "fallocate" // fallocate
	OpTruncate  Op = "truncate"  // truncate, ftruncate, O_TRUNC
	OpRename    Op = "rename"    // rename (matched on the source and the target)
	OpUnlink    Op = "unlink"    // unlink, rmdir
)

// Rule makes matching operations fail.
type Rule struct {
	// Op is the operation the rule applies to.
	Op Op
	// Path is a filepath.Match pattern for the path relative to the root
	// ("000001.vlog", "sub/*.mem"); a pattern without a slash is matched
	// against the base name. Empty matches every path.
	Path string
	// Err is the error returned; EIO when zero.
	Err syscall.Errno
	// After is how many matching calls succeed before the rule fails one.
	After int
	// Count is how many calls fail, from then on; 0 fails every later one.
	Count int
	// Tear, for OpWrite, writes the first Tear bytes of the failing write
	// before failing it (0 writes nothing).
	Tear int
	// Persist, with Tear, makes the torn prefix survive a power cut even
	// though it was never fsynced.
	Persist bool
}

// rule is a Rule with its counters.
type rule struct {
	Rule
	id     int
	seen   int
	failed int
}

func (r *rule) matches(op Op, path string) bool {
	if r.Op != op {
		return false
	}
	if r.Path == "" {
		return true
	}
	target := path
	if !strings.Contains(r.Path, "/") {
		target = filepath.Base(path)
	}
	ok, _ := filepath.Match(r.Path, target)
	return ok
}

// fire counts a matching call and reports whether it fails.
func (r *rule) fire() bool {
	r.seen++
	if r.seen <= r.After {
		return false
	}
	if r.Count > 0 && r.failed >= r.Count {
		return false
	}
	r.failed++
	return true
}

func (r *rule) errno() syscall.Errno {
	if r.Err == 0 {
		return syscall.EIO
	}
	return r.Err
}
