package faultfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
)

// rollback turns the (unmounted) backing directory into the durable
// state: file contents are rolled back (but for the pages keepPage keeps), every file is set aside by inode
// number, the directories are rebuilt from the durable names and the
// files put back under them; a file no durable name refers to is deleted.
func (f *FS) rollback(keepPage func(page int64) bool) error {
	files, err := f.backingFiles()
	if err != nil {
		return err
	}
	for ino, fu := range f.undo.files {
		p, ok := files[ino]
		if !ok || !f.durable.references(ino) {
			continue
		}
		undone, kept, err := fu.rollback(p, keepPage)
		if err != nil {
			return err
		}
		f.stats.PagesKept += kept
		f.stats.FilesRolled++
		f.stats.BytesUndone += undone
	}
	stage := f.stageDir()
	for ino, p := range files {
		if err := os.Rename(p, filepath.Join(stage, strconv.FormatUint(ino, 10))); err != nil {
			return fmt.Errorf("set %s aside: %w", p, err)
		}
	}
	if err := clearDir(f.opts.Backing); err != nil {
		return err
	}
	return f.rebuild(stage)
}

// backingFiles maps the inode number of every non-directory in the backing
// tree and the graveyard to one of its paths; other links to the same file
// are removed.
func (f *FS) backingFiles() (map[uint64]string, error) {
	files := map[uint64]string{}
	for _, root := range []string{f.opts.Backing, f.graveyardDir()} {
		n, err := walkNames(root)
		if err != nil {
			return nil, err
		}
		for rel, e := range n {
			if e.isDir() {
				continue
			}
			p := filepath.Join(root, rel)
			if _, dup := files[e.ino]; dup {
				if err := os.Remove(p); err != nil {
					return nil, fmt.Errorf("remove link %s: %w", p, err)
				}
				continue
			}
			files[e.ino] = p
		}
	}
	return files, nil
}

// clearDir removes everything in dir (only directories are left in it).
func clearDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("clear %s: %w", dir, err)
		}
	}
	return nil
}

// rebuild creates the durable tree, taking files from stage.
func (f *FS) rebuild(stage string) error {
	paths := make([]string, 0, len(f.durable))
	for p := range f.durable {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	placed := map[uint64]string{}
	made := map[string]bool{"": true}
	var missing []string
	for _, rel := range paths {
		if !made[parent(rel)] {
			continue // its directory is not durable
		}
		e, p := f.durable[rel], filepath.Join(f.opts.Backing, rel)
		var err error
		switch {
		case e.isDir():
			err = os.Mkdir(p, e.mode.Perm())
		case placed[e.ino] != "":
			err = os.Link(placed[e.ino], p)
		default:
			err = os.Rename(filepath.Join(stage, strconv.FormatUint(e.ino, 10)), p)
			if errors.Is(err, os.ErrNotExist) {
				missing = append(missing, rel)
				continue
			}
			placed[e.ino] = p
		}
		if err != nil {
			return fmt.Errorf("rebuild %s: %w", rel, err)
		}
		made[rel] = true
	}
	for _, e := range f.cur {
		if !e.isDir() && placed[e.ino] == "" {
			f.stats.FilesDropped++
		}
	}
	for rel, e := range f.durable {
		if c, ok := f.cur[rel]; !e.isDir() && made[rel] && (!ok || c.ino != e.ino) {
			f.stats.NamesRestored++
		}
	}
	if err := clearDir(stage); err != nil {
		return err
	}
	if len(missing) > 0 {
		return fmt.Errorf("durable files lost by faultfs itself: %v", missing)
	}
	return nil
}
