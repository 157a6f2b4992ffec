//go:build !linux

package listen

import (
	"syscall"
	"time"
)

// deferAccept does nothing where the kernel has no TCP_DEFER_ACCEPT: every
// connection reaches accept, and the admission sheds the silent ones.
func deferAccept(syscall.RawConn, time.Duration) error { return nil }
