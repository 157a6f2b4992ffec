package proc

import (
	"fmt"
	"net"
	"strconv"
	"time"
)

// FreePort returns a TCP port for a child to listen on: it was free on
// 127.0.0.1 a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	return port, nil
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
