package proc

import (
	"bufio"
	"net"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestStopKillsAProcessThatIgnoresSIGTERM(t *testing.T) {
	// The shell ignores SIGTERM, and so does the sleep it becomes (an
	// ignored signal stays ignored across exec).
	cmd := exec.Command("sh", "-c", "trap '' TERM; echo ready; exec sleep 30")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	p, err := Start("stubborn", cmd)
	require.NoError(t, err)
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "ready\n", line)
	require.False(t, p.Exited())
	err = p.Stop(300 * time.Millisecond)
	require.ErrorContains(t, err, "did not exit within 300ms of SIGTERM; killed")
	require.True(t, p.Exited())
	require.Equal(t, -1, p.ExitCode(), "ended by a signal")
	require.Equal(t, "signal: killed", p.ExitDescription())
	require.ErrorContains(t, p.Signal(syscall.SIGTERM), "has exited: signal: killed")
}

func TestKillEndsAStoppedProcess(t *testing.T) {
	p, err := Start("frozen", exec.Command("sleep", "30"))
	require.NoError(t, err)
	require.NoError(t, p.Signal(syscall.SIGSTOP))
	require.NoError(t, p.Kill())
	require.True(t, p.Exited())
	select {
	case <-p.Done():
	default:
		t.Fatal("Done is not closed after Kill")
	}
}

func TestExitStatus(t *testing.T) {
	p, err := Start("failing", exec.Command("sh", "-c", "exit 3"))
	require.NoError(t, err)
	require.True(t, p.Wait(10*time.Second))
	require.Equal(t, 3, p.ExitCode())
	require.Equal(t, "exit status 3", p.ExitDescription())
	require.NoError(t, p.Stop(time.Second), "stopping an exited process is a no-op")

	_, err = Start("missing", exec.Command("/nonexistent/binary"))
	require.ErrorContains(t, err, "starting missing:")
}

func TestWaitTCP(t *testing.T) {
	p, err := Start("sleeper", exec.Command("sleep", "30"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Kill() })

	addr, err := FreeAddr()
	require.NoError(t, err)
	err = p.WaitTCP(addr, 100*time.Millisecond)
	require.ErrorContains(t, err, "sleeper did not accept connections on "+addr+" within 100ms")

	failing, err := Start("failing", exec.Command("sh", "-c", "exit 3"))
	require.NoError(t, err)
	err = failing.WaitTCP(addr, 10*time.Second)
	require.ErrorContains(t, err, "failing exited during startup: exit status 3")

	l, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	require.NoError(t, p.WaitTCP(addr, 5*time.Second))
}

func TestFreePortIsBelowTheEphemeralRange(t *testing.T) {
	low, high := freePortRange()
	require.Less(t, low, high)
	// Ports the kernel hands out for port 0 come from the ephemeral range.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ephemeral := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	require.GreaterOrEqual(t, ephemeral, high, "the kernel's own pick")
	for range 20 {
		port, err := FreePort()
		require.NoError(t, err)
		require.GreaterOrEqual(t, port, low)
		require.Less(t, port, high)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		require.NoError(t, err, "port %d", port)
		require.NoError(t, l.Close())
	}
}
