package listen

import (
	"fmt"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// deferAccept sets TCP_DEFER_ACCEPT on a listening socket (TCP).
func deferAccept(c syscall.RawConn, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	secs := int((d + time.Second - 1) / time.Second)
	var err error
	if cerr := c.Control(func(fd uintptr) {
		err = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT, secs)
	}); cerr != nil {
		return cerr
	}
	if err != nil {
		return fmt.Errorf("setting TCP_DEFER_ACCEPT: %w", err)
	}
	return nil
}
