package proc

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// FreePort returns a TCP port for a child to listen on: it was free on
// 127.0.0.1 a moment ago. It is drawn at random below the kernel's
// ephemeral range. A port from that range (what listening on port 0 gives)
// is also what the kernel hands to outgoing connections and to other
// port-0 listeners, so under parallel tests it can be taken between this
// check and the child's bind: the child fails with "address already in
// use", or another process answers on its port.
func FreePort() (int, error) {
	low, high := freePortRange()
	for range 200 {
		port := low + rand.IntN(high-low)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // taken
		}
		if err := l.Close(); err != nil {
			return 0, fmt.Errorf("finding a free port: %w", err)
		}
		return port, nil
	}
	return 0, fmt.Errorf("finding a free port: no free port in %d-%d after 200 tries", low, high-1)
}

// freePortRange is the ports FreePort draws from: 10000 up to the start of
// the ephemeral range (/proc/sys/net/ipv4/ip_local_port_range, 32768 by
// default).
func freePortRange() (low, high int) {
	low, high = 10000, 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if start, err := strconv.Atoi(f[0]); err == nil && start > low+1000 {
				high = start
			}
		}
	}
	return low, high
}

// FreeAddr returns 127.0.0.1:PORT with a port from FreePort.
func FreeAddr() (string, error) {
	port, err := FreePort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}

// WaitTCP waits until addr accepts a connection, the process exits, or
// timeout passes.
func (p *Process) WaitTCP(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if p.Exited() {
			return fmt.Errorf("%s exited during startup: %v", p.Name, p.Err())
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not accept connections on %s within %s: %w", p.Name, addr, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
