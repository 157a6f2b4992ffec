//go:build unix

// Package chromiumtest runs Debian's chromium headless, so tests can look
// at the gateway's web pages as a browser renders them:
//
//	dom := chromiumtest.DumpDOM(t, url)                 // the DOM after load
//	png := chromiumtest.Screenshot(t, url, 1280, 900)   // path of a PNG
//
// Every run is bounded (90 seconds), uses a fresh profile in the test's
// temporary directory, and runs chromium with harness/proc in its own
// process group, which is killed when the run ends or times out, so no
// renderer outlives it (nor, on Linux, the test process).
// Chromium runs with --no-sandbox (tests run as root in CI, where the
// sandbox cannot start) and without background networking: the only
// traffic is to the URL given, which tests keep on 127.0.0.1.
//
// When chromium is missing, the first call installs Debian's package
// chromium with apt-get, as root, taking turns with other test binaries on
// the lock file /tmp/greenhouse-gateway-apt.lock. When that is impossible
// (not root, no apt-get, or apt-get fails) the test is skipped, unless the
// environment variable CI is set: then it fails.
package chromiumtest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"greenhouse-gateway/harness/debpkg"
	"greenhouse-gateway/harness/proc"
	"greenhouse-gateway/harness/syncbuf"
)

const (
	// runTimeout bounds one chromium run.
	runTimeout = 90 * time.Second
	// tailBytes is how much chromium output is kept for error messages.
	tailBytes = 8 << 10
)

// DumpDOM loads url and returns the DOM chromium serializes after the page
// loaded (--dump-dom).
func DumpDOM(tb testing.TB, url string) string {
	tb.Helper()
	out := run(tb, "--dump-dom", url)
	if len(bytes.TrimSpace(out)) == 0 {
		tb.Fatalf("chromiumtest: chromium printed no DOM for %s", url)
	}
	return string(out)
}

// Screenshot loads url in a width × height window and returns the path of
// the PNG chromium wrote (in the test's temporary directory).
func Screenshot(tb testing.TB, url string, width, height int) string {
	tb.Helper()
	file := filepath.Join(tb.TempDir(), "screenshot.png")
	out := run(tb, "--screenshot="+file, "--window-size="+strconv.Itoa(width)+","+strconv.Itoa(height),
		"--hide-scrollbars", url)
	if st, err := os.Stat(file); err != nil || st.Size() == 0 {
		tb.Fatalf("chromiumtest: chromium wrote no screenshot of %s (%v); its output:\n%s", url, err, out)
	}
	return file
}

// run runs chromium headless with args and returns its standard output.
func run(tb testing.TB, args ...string) []byte {
	tb.Helper()
	bin := binary(tb)
	home := tb.TempDir()
	all := append([]string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--no-first-run", "--no-default-browser-check", "--user-data-dir=" + filepath.Join(home, "profile"),
	}, args...)
	cmd := exec.Command(bin, all...)
	cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, "config"),
		"XDG_CACHE_HOME="+filepath.Join(home, "cache"))
	cmd.WaitDelay = 5 * time.Second
	var stdout bytes.Buffer // read once the process was reaped
	stderr := &syncbuf.Buffer{Max: tailBytes}
	cmd.Stdout, cmd.Stderr = &stdout, stderr
	p, err := proc.Start("chromium", cmd)
	if err != nil {
		tb.Fatalf("chromiumtest: chromium %s: %v; its output:\n%s", strings.Join(args, " "), err, stderr.String())
	}
	if !p.Wait(runTimeout) {
		_ = p.Kill()
		tb.Fatalf("chromiumtest: chromium did not finish within %s (%s); its output:\n%s",
			runTimeout, strings.Join(args, " "), stderr.String())
	}
	// Renderers and helpers are in chromium's process group: none outlives
	// the run.
	_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
	if err := p.Err(); err != nil {
		tb.Fatalf("chromiumtest: chromium %s: %v; its output:\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.Bytes()
}

// binary returns chromium's path, installing it when missing; it skips tb
// (fails it when CI is set) when that is impossible.
func binary(tb testing.TB) string {
	tb.Helper()
	if bin, ok := installed(); ok {
		return bin
	}
	install.Do(func() { install.err = runInstall() })
	if install.err == nil {
		if bin, ok := installed(); ok {
			return bin
		}
		install.err = errors.New("after apt-get install, chromium is still not on PATH")
	}
	if os.Getenv("CI") != "" {
		tb.Fatalf("chromiumtest: %v", install.err)
		return ""
	}
	tb.Skipf("chromiumtest: %v", install.err)
	return ""
}

var install struct {
	sync.Once
	err error
}

func installed() (string, bool) {
	bin, err := exec.LookPath("chromium")
	return bin, err == nil
}

func runInstall() error {
	ctx, cancel := context.WithTimeout(context.Background(), debpkg.Timeout)
	defer cancel()
	return debpkg.Install(ctx, func() bool { _, ok := installed(); return ok }, "chromium")
}
