package listen

import (
	"context"
	"net"
	"syscall"
	"time"
)

// TCP binds addr for a protocol whose clients speak first: MQTT's
// CONNECT, an HTTP request, a TLS ClientHello. Where the kernel offers it
// (Linux's TCP_DEFER_ACCEPT), a connection enters the listener's accept
// queue only once its first bytes arrive, or after about deferFor without
// any (the kernel rounds up to its SYN-ACK retransmissions: 10 s is about
// 15 s). A socket that sends nothing then waits in the kernel's SYN queue
// (a request socket of a few hundred bytes: no descriptor, no goroutine)
// instead of ahead of the devices in the accept queue, and the gateway
// neither accepts nor sheds it; once it comes through, the connection's
// own timeout and the admission apply as to any other.
func TCP(addr string, deferFor time.Duration) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		return deferAccept(c, deferFor)
	}}
	return lc.Listen(context.Background(), "tcp", addr)
}
