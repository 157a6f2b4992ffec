// Package sdnotify is the service side of systemd's notify protocol
// (sd_notify(3)), without dependencies: a service of Type=notify tells
// systemd it is ready, that it is stopping, a one-line status, and feeds
// the watchdog of WatchdogSec=.
//
// Messages are newline-separated VAR=value assignments sent as one datagram
// to the AF_UNIX socket named by $NOTIFY_SOCKET: a path, or an abstract
// socket name written with a leading '@'. Without $NOTIFY_SOCKET (the
// process was not started by systemd, or the unit is not Type=notify and
// has no NotifyAccess=) every function does nothing and returns nil, so
// callers need no "under systemd?" branch.
//
// The watchdog is on when $WATCHDOG_USEC is set (and $WATCHDOG_PID, when
// set, is this process); systemd then expects WATCHDOG=1 at least once per
// interval and otherwise kills the service with WatchdogSignal= (SIGABRT
// by default, which makes a Go program print its goroutines and exit).
// RunWatchdog sends it at half the interval while a health check passes.
//
// With NotifyAccess=main, only the main process may send: call these from
// the daemon itself, not from a child it starts.
package sdnotify

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// Environment variables set by systemd for the service.
const (
	envSocket       = "NOTIFY_SOCKET"
	envWatchdogUsec = "WATCHDOG_USEC"
	envWatchdogPID  = "WATCHDOG_PID"
)

// writeTimeout bounds sending one message.
const writeTimeout = time.Second

// Notify sends state, one or more newline-separated assignments such as
// "READY=1" or "STATUS=serving", to the socket named by $NOTIFY_SOCKET.
// It returns nil without sending when $NOTIFY_SOCKET is unset or empty.
// A leading '@' in the socket name selects Linux's abstract namespace.
func Notify(state string) error {
	name := os.Getenv(envSocket)
	if name == "" {
		return nil
	}
	if name[0] != '@' && name[0] != '/' {
		// systemd 254 and later may name a vsock address; a service on a
		// Raspberry Pi is never handed one.
		return fmt.Errorf("sdnotify: unsupported %s %q: not a path or an abstract socket name", envSocket, name)
	}
	// Go's net package turns a leading '@' into the NUL byte that names an
	// abstract socket.
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("sdnotify: connecting to %s: %w", name, err)
	}
	defer conn.Close()
	// A datagram socket whose receiver is stuck would block a write
	// forever; systemd reads promptly, so a second is plenty.
	if err := conn.SetWriteDeadline(time.Now().Add(writeTimeout)); err != nil {
		return fmt.Errorf("sdnotify: %w", err)
	}
	if _, err := conn.Write([]byte(state)); err != nil {
		return fmt.Errorf("sdnotify: sending to %s: %w", name, err)
	}
	return nil
}

// Ready tells systemd that start-up is complete (READY=1): units ordered
// after this one start, and `systemctl start` returns.
func Ready() error { return Notify("READY=1") }

// Stopping tells systemd that the service is shutting down (STOPPING=1).
func Stopping() error { return Notify("STOPPING=1") }

// Status sets the one-line status shown by `systemctl status`
// (STATUS=...). Newlines in s are replaced by spaces, since a newline would
// end the assignment.
func Status(s string) error {
	return Notify("STATUS=" + strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(s))
}

// Watchdog feeds the service watchdog once (WATCHDOG=1).
func Watchdog() error { return Notify("WATCHDOG=1") }

// WatchdogInterval returns the watchdog interval systemd expects
// WATCHDOG=1 within ($WATCHDOG_USEC, from WatchdogSec=) and true, or zero
// and false when the watchdog is off: $WATCHDOG_USEC unset, zero or
// malformed, or $WATCHDOG_PID set to another process's ID (the variables
// were inherited from a parent).
func WatchdogInterval() (time.Duration, bool) {
	usec, err := strconv.ParseUint(os.Getenv(envWatchdogUsec), 10, 63)
	if err != nil || usec == 0 || usec > uint64(1<<63-1)/uint64(time.Microsecond) {
		return 0, false
	}
	if p := os.Getenv(envWatchdogPID); p != "" {
		pid, err := strconv.Atoi(p)
		if err != nil || pid != os.Getpid() {
			return 0, false
		}
	}
	return time.Duration(usec) * time.Microsecond, true
}

// RunWatchdog feeds systemd's watchdog until ctx is done, then returns nil.
// Every half watchdog interval it calls healthy and sends WATCHDOG=1 only
// if healthy returned nil: a service whose check fails, or hangs, for a
// whole interval is killed by systemd (and restarted, with
// Restart=on-failure). It returns nil at once when the watchdog is off
// (see WatchdogInterval), so it can always be run in the daemon's
// errgroup.
//
// healthy is called from a goroutine of its own, one call at a time; a
// call still running when the next ping is due withholds that ping.
// healthy should be fast (well under a second) and test liveness, not
// load: a check that fails while the service is merely busy or waiting
// for the network makes systemd restart it for nothing. Log in healthy
// if the reason for a withheld ping should reach the journal.
//
// A failure to send a ping is not returned: the missing ping is what
// systemd acts on. A check hanging when ctx ends is left to return on its
// own.
func RunWatchdog(ctx context.Context, healthy func() error) error {
	interval, ok := WatchdogInterval()
	if !ok {
		return nil
	}
	period := interval / 2
	if period <= 0 {
		period = interval
	}
	ticker := time.NewTicker(period)
	defer ticker.Stop()

	results := make(chan error, 1) // buffered: a late check never blocks
	checking := false
	check := func() {
		checking = true
		go func() { results <- healthy() }()
	}
	check()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-results:
			checking = false
			if err == nil && ctx.Err() == nil {
				_ = Watchdog()
			}
		case <-ticker.C:
			if !checking {
				check()
			}
		}
	}
}
