package faultfs

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// entry is one name in the tree: the backing inode it names (0 for a
// directory) and its mode (type and permissions).
type entry struct {
	ino  uint64
	mode os.FileMode
}

func (e entry) isDir() bool { return e.mode.IsDir() }

// names is the tree as paths relative to the root ("a/b"), the root itself
// not included.
type names map[string]entry

func (n names) clone() names {
	c := make(names, len(n))
	for k, v := range n {
		c[k] = v
	}
	return c
}

// references reports whether some path names ino.
func (n names) references(ino uint64) bool {
	for _, e := range n {
		if !e.isDir() && e.ino == ino {
			return true
		}
	}
	return false
}

// move renames from to to, with everything below from.
func (n names) move(from, to string) {
	for p, e := range n {
		if p == from {
			delete(n, p)
			n[to] = e
		} else if rest, ok := strings.CutPrefix(p, from+"/"); ok {
			delete(n, p)
			n[to+"/"+rest] = e
		}
	}
}

// remove deletes p and everything below it.
func (n names) remove(p string) {
	for q := range n {
		if q == p || strings.HasPrefix(q, p+"/") {
			delete(n, q)
		}
	}
}

// syncDir makes the entries directly in directory dir of cur durable in n.
func (n names) syncDir(dir string, cur names) {
	for p := range n {
		if parent(p) == dir {
			delete(n, p)
		}
	}
	for p, e := range cur {
		if parent(p) == dir {
			n[p] = e
		}
	}
}

func parent(p string) string {
	d := filepath.Dir(p)
	if d == "." {
		return ""
	}
	return d
}

// walkNames reads the tree under root.
func walkNames(root string) (names, error) {
	n := names{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		e, err := lstatEntry(p)
		if err != nil {
			return err
		}
		n[rel] = e
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("walk %s: %w", root, err)
	}
	return n, nil
}

func lstatEntry(p string) (entry, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return entry{}, err
	}
	e := entry{mode: fi.Mode()}
	if !fi.IsDir() {
		e.ino = fi.Sys().(*syscall.Stat_t).Ino
	}
	return e, nil
}
