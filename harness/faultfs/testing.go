package faultfs

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// Mount mounts a file system over backing (created if missing) on a new
// temporary directory for the test and unmounts it when the test ends. It
// skips the test, saying why, where FUSE is unavailable.
func Mount(t testing.TB, backing string, opts ...func(*Options)) *FS {
	t.Helper()
	if err := os.MkdirAll(backing, 0o755); err != nil {
		t.Fatalf("faultfs: create backing %s: %v", backing, err)
	}
	o := Options{Backing: backing, Mountpoint: filepath.Join(t.TempDir(), "mnt")}
	for _, opt := range opts {
		opt(&o)
	}
	if err := os.MkdirAll(o.Mountpoint, 0o755); err != nil {
		t.Fatalf("faultfs: create mount point: %v", err)
	}
	f, err := Start(o)
	if errors.Is(err, ErrUnavailable) {
		t.Skipf("power-cut tests need FUSE: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Unmount(); err != nil {
			t.Errorf("faultfs: %v", err)
		}
	})
	return f
}
