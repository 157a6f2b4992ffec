package main

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// socketFlood holds n TCP sockets from one source address open to a
// listener without sending anything, and reopens each the moment the
// gateway closes it, from one loop on one thread (non-blocking sockets and
// epoll, as a single-threaded C client does it), until stop or its time
// limit.
type socketFlood struct {
	opened, closedByPeer, failed atomic.Int64
	stopped                      atomic.Bool
	done                         chan struct{}
	once                         sync.Once
}

// startSocketFlood starts a flood of n sockets from src (an IPv4 loopback
// address) to addr, for at most limit.
func startSocketFlood(t *testing.T, src, addr string, n int, limit time.Duration) *socketFlood {
	t.Helper()
	to, err := netip.ParseAddrPort(addr)
	require.NoError(t, err)
	from, err := netip.ParseAddr(src)
	require.NoError(t, err)
	require.True(t, to.Addr().IsLoopback() && from.IsLoopback(), "floods stay on the loopback")
	f := &socketFlood{done: make(chan struct{})}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	require.NoError(t, err)
	go f.run(ep, from.As4(), to, n, time.Now().Add(limit))
	t.Cleanup(f.stop)
	return f
}

// open starts one non-blocking connection and watches it for its close.
func (f *socketFlood) open(ep int, from [4]byte, to netip.AddrPort) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	// The source port is picked at connect, by the whole 4-tuple: one
	// address can then hold more than the ephemeral range's worth of
	// connections over time.
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: from}); err != nil {
		unix.Close(fd)
		return -1, err
	}
	err = unix.Connect(fd, &unix.SockaddrInet4{Addr: to.Addr().As4(), Port: int(to.Port())})
	if err != nil && !errors.Is(err, unix.EINPROGRESS) {
		unix.Close(fd)
		return -1, err
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP, Fd: int32(fd)}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		unix.Close(fd)
		return -1, err
	}
	f.opened.Add(1)
	return fd, nil
}

func (f *socketFlood) run(ep int, from [4]byte, to netip.AddrPort, n int, deadline time.Time) {
	defer close(f.done)
	live := map[int]struct{}{}
	defer func() {
		for fd := range live {
			unix.Close(fd)
		}
		unix.Close(ep)
	}()
	events := make([]unix.EpollEvent, 256)
	for !f.stopped.Load() && time.Now().Before(deadline) {
		for len(live) < n {
			fd, err := f.open(ep, from, to)
			if err != nil {
				f.failed.Add(1)
				break // tried again after the next wait
			}
			live[fd] = struct{}{}
		}
		k, err := unix.EpollWait(ep, events, 20)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return
		}
		for _, ev := range events[:max(k, 0)] {
			fd := int(ev.Fd)
			_ = unix.EpollCtl(ep, unix.EPOLL_CTL_DEL, fd, nil)
			unix.Close(fd)
			delete(live, fd)
			f.closedByPeer.Add(1)
		}
	}
}

// stop ends the flood and closes its sockets.
func (f *socketFlood) stop() {
	f.once.Do(func() { f.stopped.Store(true) })
	<-f.done
}

// TestAttackFastSilentSocketFlood holds silent sockets from one address
// (127.0.0.3) against gatewayd's MQTT listener, each reopened the moment
// the gateway closes it, from one thread, and checks that a device from
// its own address (127.0.0.1) meanwhile gets its CONNACK, PUBACK and
// "accepted" ack on every try. make attack runs 1,030 sockets (tens of
// thousands of connections a second where the gateway accepts and sheds
// them), make test 300 for a few seconds.
func TestAttackFastSilentSocketFlood(t *testing.T) {
	n := attackSize(300, 1030)
	tries := attackSize(4, 10)
	raiseFDLimit(t, uint64(n)+1000)
	d, key := attackDaemon(t)
	// The device's key was used before (cached), as a fleet's is.
	require.NoError(t, pahoDeviceTry(d.mqttAddr, "02:00:00:B0:FF:FF", key, 30*time.Second))

	f := startSocketFlood(t, "127.0.0.3", d.mqttAddr, n, attackSizeDuration(30*time.Second, 3*time.Minute))
	require.Eventually(t, func() bool { return f.opened.Load() >= int64(n) }, 30*time.Second, 10*time.Millisecond,
		"the flood opens its sockets")
	time.Sleep(attackSizeDuration(500*time.Millisecond, 2*time.Second)) // at its rate
	opened, start := f.opened.Load(), time.Now()
	// Sockets that send nothing are kept out of accept by the kernel
	// (TCP_DEFER_ACCEPT, for about 15 s): none was accepted and shed yet,
	// so the flood does not reopen them.
	require.Less(t, f.closedByPeer.Load(), int64(n), "silent sockets accepted and shed in the flood's first seconds")
	ok := 0
	var connack, took []time.Duration
	for i := range tries {
		if i > 0 {
			time.Sleep(attackSizeDuration(300*time.Millisecond, 2*time.Second))
		}
		hw := fmt.Sprintf("02:00:00:B0:00:%02X", i)
		begin := time.Now()
		deadline := begin.Add(10 * time.Second)
		m, code, err := rawConnect(d.mqttAddr, 4, hw, hw, key, deadline)
		connack = append(connack, time.Since(begin))
		if err == nil && code != 0 {
			err = fmt.Errorf("CONNACK %#x", code)
		}
		if err == nil {
			err = m.publishBatch(hw, deadline)
		}
		if m != nil {
			m.c.Close()
		}
		took = append(took, time.Since(begin))
		if err != nil {
			t.Logf("device try %d: %v after %s", i, err, time.Since(begin).Round(time.Millisecond))
			continue
		}
		ok++
	}
	elapsed := time.Since(start)
	rate := float64(f.opened.Load()-opened) / elapsed.Seconds()
	f.stop()
	t.Logf("%d silent sockets from one address, reopened at once (%.0f connections/s, %d closed by gatewayd, "+
		"%d failed to open): device accepted on %d of %d tries in %s; CONNACK %s; CONNACK to ack %s",
		n, rate, f.closedByPeer.Load(), f.failed.Load(), ok, tries, elapsed.Round(100*time.Millisecond),
		durations(connack), durations(took))
	require.Equal(t, tries, ok, "device tries answered CONNACK, PUBACK and accepted within 10 s")
}
