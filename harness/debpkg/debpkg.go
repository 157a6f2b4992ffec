// Package debpkg installs the Debian packages the integration tests drive
// (mosquitto, chromium, qemu-user, promtool, the Pushgateway), for a test that
// finds its program missing. `make test-deps` installs them all before the
// tests; this is what a test run on its own falls back to.
//
// Test binaries of different packages run in parallel and apt allows one run
// at a time, so installs take a lock file first (/tmp/greenhouse-gateway-
// apt.lock), then wait for apt's own locks (another apt run on the machine).
package debpkg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// lockPath serializes installs by concurrent test binaries.
const lockPath = "/tmp/greenhouse-gateway-apt.lock"

// Timeout is a sensible bound for Install: apt-get update and install of one
// large package (chromium) on a slow mirror, lock waits included.
const Timeout = 10 * time.Minute

// Install installs pkgs with apt-get unless present reports them installed;
// present is asked again once the lock is held, since another test binary
// may have installed them meanwhile, and after the install. It needs root;
// without it, or without apt-get, the error says what to install.
func Install(ctx context.Context, present func() bool, pkgs ...string) error {
	if present() {
		return nil
	}
	what := strings.Join(pkgs, " ")
	if os.Geteuid() != 0 {
		return fmt.Errorf("%s is not installed and this is not root: run apt-get install -y %s", what, what)
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return fmt.Errorf("%s is not installed and there is no apt-get to install it", what)
	}
	unlock, err := lockFile(ctx, lockPath)
	if err != nil {
		return err
	}
	defer unlock()
	if present() {
		return nil
	}
	for _, args := range [][]string{
		{"-o", "DPkg::Lock::Timeout=120", "update"},
		append([]string{"-o", "DPkg::Lock::Timeout=120", "install", "-y", "--no-install-recommends"}, pkgs...),
	} {
		if err := aptGet(ctx, args); err != nil {
			return err
		}
	}
	if !present() {
		return fmt.Errorf("after apt-get install %s, its programs are still missing", what)
	}
	return nil
}

// aptGet runs apt-get with args, again (up to 5 times in all) while another
// apt or dpkg run, which our lock file does not cover, holds apt's locks.
func aptGet(ctx context.Context, args []string) error {
	for attempt := 1; ; attempt++ {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.CombinedOutput()
		if err == nil {
			return nil
		}
		locked := bytes.Contains(out, []byte("Could not get lock")) || bytes.Contains(out, []byte("Unable to acquire"))
		if !locked || attempt == 5 || ctx.Err() != nil {
			return fmt.Errorf("apt-get %s: %w\n%s", strings.Join(args, " "), err, tail(out, 8<<10))
		}
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
		}
	}
}

// lockFile takes an exclusive flock on path, polling until ctx is done.
func lockFile(ctx context.Context, path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the install lock: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				_ = f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			_ = f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("waiting for %s (another install running): %w", path, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func tail(b []byte, max int) []byte {
	if len(b) > max {
		return b[len(b)-max:]
	}
	return b
}
