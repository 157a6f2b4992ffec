package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The attack tests (TestAttack*) run what a hostile or broken host on the
// LAN does against a real gatewayd on the loopback. make test runs small
// variants; `make attack` sets GATEWAY_ATTACK_FULL=1 for the sizes the
// figures in cmd/bench/MEASUREMENTS.md come from (thousands of sockets).
const envAttackFull = "GATEWAY_ATTACK_FULL"

// attackFull reports whether the full-size variants run.
func attackFull() bool { return os.Getenv(envAttackFull) == "1" }

// attackSize returns full under `make attack`, else small.
func attackSize(small, full int) int {
	if attackFull() {
		return full
	}
	return small
}

var (
	plainOnce sync.Once
	plainPath string
	plainErr  error
)

// gatewaydPlainBinary builds gatewayd once without the race detector, for
// tests that measure memory (race instrumentation multiplies it).
func gatewaydPlainBinary(t *testing.T) string {
	t.Helper()
	plainOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gatewayd-plain")
		if err != nil {
			plainErr = err
			return
		}
		plainPath = filepath.Join(dir, "gatewayd")
		out, err := exec.Command("go", "build", "-o", plainPath, ".").CombinedOutput()
		if err != nil {
			plainErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	require.NoError(t, plainErr)
	return plainPath
}

// startPlainDaemon is startDaemon with the production build (no race
// detector), so that its resident set means what it means on a device.
func startPlainDaemon(t *testing.T, dataDir, endpoint, prefix string, extraEnv ...string) *daemon {
	t.Helper()
	return startDaemonBinary(t, gatewaydPlainBinary(t), dataDir, endpoint, prefix, extraEnv...)
}

// rssBytes reads a process's resident set from /proc.
func rssBytes(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// dialFrom opens a TCP connection to addr from the loopback address src
// (e.g. "127.0.0.2"), so that an attacker and a device have different
// source addresses as on a LAN.
func dialFrom(src, addr string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	return d.Dial("tcp", addr)
}

// peakRSS samples pid's resident set every 50 ms until stop is called and
// returns the largest sample.
func peakRSS(t *testing.T, pid int) (stop func() int64) {
	done, out := make(chan struct{}), make(chan int64, 1)
	go func() {
		var peak int64
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				out <- peak
				return
			case <-tick.C:
				peak = max(peak, rssBytes(t, pid))
			}
		}
	}()
	var once sync.Once
	var peak int64
	stop = func() int64 {
		once.Do(func() {
			close(done)
			peak = <-out
		})
		return peak
	}
	t.Cleanup(func() { stop() })
	return stop
}

// metricFloat reads a series of gatewayd's /metrics as a number.
func metricFloat(t *testing.T, d *daemon, series string) float64 {
	t.Helper()
	v := d.metric(t, series)
	require.NotEmpty(t, v, "no series %s", series)
	f, err := strconv.ParseFloat(v, 64)
	require.NoError(t, err)
	return f
}

// mqttFrame frames an MQTT packet: the first header byte, the remaining
// length and the body.
func mqttFrame(first byte, body []byte) []byte {
	out := []byte{first}
	for n := len(body); ; {
		d := byte(n % 128)
		if n /= 128; n > 0 {
			d |= 0x80
		}
		out = append(out, d)
		if n == 0 {
			break
		}
	}
	return append(out, body...)
}

// mqttString encodes an MQTT string: its length in two bytes, then s.
func mqttString(s string) []byte {
	return append(binary.BigEndian.AppendUint16(nil, uint16(len(s))), s...)
}

// readMQTTPacket reads one MQTT packet from r: its first header byte and
// its body.
func readMQTTPacket(r io.Reader) (byte, []byte, error) {
	var one [1]byte
	if _, err := io.ReadFull(r, one[:]); err != nil {
		return 0, nil, err
	}
	first, n := one[0], 0
	for i := 0; i < 4; i++ {
		if _, err := io.ReadFull(r, one[:]); err != nil {
			return 0, nil, err
		}
		n |= int(one[0]&0x7f) << (7 * i)
		if one[0]&0x80 == 0 {
			break
		}
	}
	body := make([]byte, n)
	_, err := io.ReadFull(r, body)
	return first, body, err
}

func TestRSSBytesReadsThisProcess(t *testing.T) {
	rss := rssBytes(t, os.Getpid())
	require.Greater(t, rss, int64(1<<20), "a Go test binary holds more than 1 MiB")
	require.Less(t, rss, int64(8<<30))
}

func TestDialFromUsesTheSourceAddress(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	got := make(chan string, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			got <- err.Error()
			return
		}
		got <- c.RemoteAddr().(*net.TCPAddr).IP.String()
		c.Close()
	}()
	c, err := dialFrom("127.0.0.7", l.Addr().String(), 5*time.Second)
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, "127.0.0.7", <-got)
}
