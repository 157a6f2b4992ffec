package sdnotify_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"greenhouse-gateway/internal/sdnotify"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// listen binds a unixgram socket (a path in a fresh directory, or an
// abstract name when abstract is set), points NOTIFY_SOCKET at it as
// systemd would, and returns the socket to read messages from.
func listen(t testing.TB, abstract bool) *net.UnixConn {
	t.Helper()
	name := filepath.Join(t.TempDir(), "notify")
	if abstract {
		name = fmt.Sprintf("@greenhouse-gateway/sdnotify-test/%d/%d", os.Getpid(), time.Now().UnixNano())
	}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatalf("binding %s: %v", name, err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", name)
	return conn
}

// receive returns the next datagram, or "" after timeout.
func receive(t testing.TB, conn *net.UnixConn, timeout time.Duration) string {
	t.Helper()
	if err := conn.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	n, _, err := conn.ReadFromUnix(buf)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return ""
	}
	if err != nil {
		t.Fatalf("reading the notify socket: %v", err)
	}
	return string(buf[:n])
}

func TestMessages(t *testing.T) {
	tests := []struct {
		name string
		send func() error
		want string
	}{
		{"ready", sdnotify.Ready, "READY=1"},
		{"stopping", sdnotify.Stopping, "STOPPING=1"},
		{"watchdog", sdnotify.Watchdog, "WATCHDOG=1"},
		{"status", func() error { return sdnotify.Status("serving: mqtt :1883, http :8080") }, "STATUS=serving: mqtt :1883, http :8080"},
		{"status on one line", func() error { return sdnotify.Status("line one\nline two\r\nthree") }, "STATUS=line one line two three"},
		{"several assignments", func() error { return sdnotify.Notify("READY=1\nSTATUS=up") }, "READY=1\nSTATUS=up"},
	}
	for _, abstract := range []bool{false, true} {
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%s/abstract=%v", tt.name, abstract), func(t *testing.T) {
				conn := listen(t, abstract)
				if err := tt.send(); err != nil {
					t.Fatal(err)
				}
				if got := receive(t, conn, 2*time.Second); got != tt.want {
					t.Fatalf("received %q, want %q", got, tt.want)
				}
			})
		}
	}
}

func TestNoSocketIsNoOp(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	for name, send := range map[string]func() error{
		"ready": sdnotify.Ready, "stopping": sdnotify.Stopping, "watchdog": sdnotify.Watchdog,
		"status": func() error { return sdnotify.Status("x") },
	} {
		if err := send(); err != nil {
			t.Errorf("%s without NOTIFY_SOCKET: %v, want nil", name, err)
		}
	}
}

func TestNotifyErrors(t *testing.T) {
	tests := []struct{ name, socket string }{
		{"missing socket", filepath.Join(t.TempDir(), "absent")},
		{"vsock address", "vsock:2:1234"},
		{"relative path", "notify.sock"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("NOTIFY_SOCKET", tt.socket)
			if err := sdnotify.Ready(); err == nil {
				t.Fatalf("Ready with NOTIFY_SOCKET=%q: nil error", tt.socket)
			}
		})
	}
}

func TestWatchdogInterval(t *testing.T) {
	self := strconv.Itoa(os.Getpid())
	tests := []struct {
		name      string
		usec, pid string
		want      time.Duration
		wantOK    bool
	}{
		{name: "unset"},
		{name: "zero", usec: "0"},
		{name: "malformed", usec: "30s"},
		{name: "negative", usec: "-5"},
		{name: "overflow", usec: "18446744073709551615"},
		{name: "30 seconds", usec: "30000000", want: 30 * time.Second, wantOK: true},
		{name: "for this process", usec: "30000000", pid: self, want: 30 * time.Second, wantOK: true},
		{name: "for another process", usec: "30000000", pid: "1"},
		{name: "malformed pid", usec: "30000000", pid: "me"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("WATCHDOG_USEC", tt.usec)
			t.Setenv("WATCHDOG_PID", tt.pid)
			got, ok := sdnotify.WatchdogInterval()
			if got != tt.want || ok != tt.wantOK {
				t.Fatalf("WatchdogInterval() = %v, %v; want %v, %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestRunWatchdogOffReturnsAtOnce(t *testing.T) {
	listen(t, false)
	t.Setenv("WATCHDOG_USEC", "")
	done := make(chan error, 1)
	go func() {
		done <- sdnotify.RunWatchdog(context.Background(), func() error { return nil })
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("RunWatchdog without WATCHDOG_USEC did not return")
	}
}

// startWatchdog runs RunWatchdog with a 200 ms interval (pings due every
// 100 ms) and returns a function that stops it and waits for its return.
func startWatchdog(t testing.TB, healthy func() error) (stop func()) {
	t.Helper()
	t.Setenv("WATCHDOG_USEC", "200000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sdnotify.RunWatchdog(ctx, healthy) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("RunWatchdog returned %v", err)
			}
		case <-time.After(2 * time.Second):
			t.Error("RunWatchdog did not return after its context was cancelled")
		}
	}
	t.Cleanup(stop)
	return stop
}

// pings returns when each WATCHDOG=1 datagram arrived within d.
func pings(t testing.TB, conn *net.UnixConn, d time.Duration) []time.Time {
	t.Helper()
	var at []time.Time
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return at
		}
		switch msg := receive(t, conn, left); msg {
		case "":
			return at
		case "WATCHDOG=1":
			at = append(at, time.Now())
		default:
			t.Fatalf("unexpected message %q", msg)
		}
	}
}

// count returns how many WATCHDOG=1 datagrams arrive within d.
func count(t testing.TB, conn *net.UnixConn, d time.Duration) int {
	t.Helper()
	return len(pings(t, conn, d))
}

// shortestGap returns the shortest time between two WATCHDOG=1 datagrams
// arriving within d (d when fewer than two came).
func shortestGap(t testing.TB, conn *net.UnixConn, d time.Duration) time.Duration {
	t.Helper()
	at := pings(t, conn, d)
	shortest := d
	for i := 1; i < len(at); i++ {
		shortest = min(shortest, at[i].Sub(at[i-1]))
	}
	return shortest
}

func TestRunWatchdogPingsWhileHealthy(t *testing.T) {
	conn := listen(t, false)
	var failing atomic.Bool
	startWatchdog(t, func() error {
		if failing.Load() {
			return errors.New("committer stuck")
		}
		return nil
	})

	// Healthy: a ping at once, then one every 100 ms.
	if got := receive(t, conn, time.Second); got != "WATCHDOG=1" {
		t.Fatalf("first message %q, want WATCHDOG=1 at once", got)
	}
	// Every half interval: the watchdog's ticker keeps its schedule when a
	// ping is late, so two of them come closer than the full interval.
	if gap := shortestGap(t, conn, 550*time.Millisecond); gap >= 150*time.Millisecond {
		t.Fatalf("pings at least %v apart while healthy, want about 100 ms (every half interval)", gap)
	}

	// Unhealthy: the pings stop (one may have been decided already).
	failing.Store(true)
	count(t, conn, 150*time.Millisecond)
	if n := count(t, conn, 400*time.Millisecond); n != 0 {
		t.Fatalf("%d pings while unhealthy, want none", n)
	}

	// Healthy again: they resume.
	failing.Store(false)
	if n := count(t, conn, 400*time.Millisecond); n < 1 {
		t.Fatalf("%d pings after recovery, want pings again", n)
	}
}

func TestRunWatchdogHangingCheckWithholdsPings(t *testing.T) {
	conn := listen(t, false)
	release := make(chan struct{})
	var calls atomic.Int32
	stop := startWatchdog(t, func() error {
		calls.Add(1)
		<-release
		return nil
	})
	if n := count(t, conn, 500*time.Millisecond); n != 0 {
		t.Fatalf("%d pings while the health check hangs, want none", n)
	}
	if c := calls.Load(); c != 1 {
		t.Fatalf("%d health checks started while the first hangs, want 1", c)
	}
	// Cancelling returns at once, even with the check still hanging.
	stop()
	close(release)
	// The late result of the check is not sent as a ping after the stop.
	if n := count(t, conn, 200*time.Millisecond); n != 0 {
		t.Fatalf("%d pings after RunWatchdog returned", n)
	}
	// Give the released check goroutine time to finish before goleak looks.
	time.Sleep(50 * time.Millisecond)
}
