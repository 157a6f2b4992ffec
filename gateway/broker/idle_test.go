//go:build !race

// The race detector's instrumentation enlarges every frame, and with them
// the stack an idle connection holds: this file measures the stacks of the
// build that runs in production, so it is left out of race builds.

package broker_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"runtime"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/gatewaytest"
)

// rawDevice is a minimal MQTT 3.1.1 client on the test's own goroutine,
// so that the process's goroutine stacks are the broker's.
type rawDevice struct {
	t  *testing.T
	hw string
	c  net.Conn
	r  *bufio.Reader
}

func dialRawDevice(t *testing.T, addr, hw string) *rawDevice {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(addr, "tcp://"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	d := &rawDevice{t: t, hw: hw, c: c, r: bufio.NewReader(c)}
	d.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 4,
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), Clean: true, Keepalive: 600,
			ClientIdentifier: hw, UsernameFlag: true, Username: []byte(hw), PasswordFlag: true, Password: []byte(gatewaytest.GoodKey)}})
	typ, body := d.next()
	require.Equal(t, packets.Connack, typ)
	require.Equal(t, []byte{0, 0}, body, "connection accepted")
	return d
}

func (d *rawDevice) send(pk packets.Packet) {
	d.t.Helper()
	b, err := encodePacket(pk)
	require.NoError(d.t, err)
	_, err = d.c.Write(b)
	require.NoError(d.t, err)
}

// next reads one packet: its type and body.
func (d *rawDevice) next() (byte, []byte) {
	d.t.Helper()
	require.NoError(d.t, d.c.SetReadDeadline(time.Now().Add(20*time.Second)))
	first, err := d.r.ReadByte()
	require.NoError(d.t, err)
	n := 0
	for i := 0; ; i++ {
		require.Less(d.t, i, 4, "remaining length")
		b, err := d.r.ReadByte()
		require.NoError(d.t, err)
		n |= int(b&0x7f) << (7 * i)
		if b&0x80 == 0 {
			break
		}
	}
	body := make([]byte, n)
	_, err = io.ReadFull(d.r, body)
	require.NoError(d.t, err)
	return first >> 4, body
}

func goroutineStackBytes() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/stacks:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestIdleConnectionStacksShrink checks what an idle device costs in
// goroutine stacks: mochi serves each connection with a read and a write
// goroutine, whose stacks grow while a packet is handled (32 KiB for the
// reader). Once the device idles, a garbage collection must be able to
// shrink them, which it does only for a stack less than a quarter in use:
// the reader waits in the connection guard's Read, under mochi's frames.
func TestIdleConnectionStacksShrink(t *testing.T) {
	h := startHostile(t, hostileOptions{})
	const n = 200
	runtime.GC()
	before := goroutineStackBytes()
	devices := make([]*rawDevice, 0, n)
	for i := range n {
		devices = append(devices, dialRawDevice(t, h.MQTTAddr, fmt.Sprintf("AA:BB:CC:DE:%02X:%02X", i>>8, i&0xff)))
	}
	for _, d := range devices {
		d.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1}, PacketID: 1,
			Filters: packets.Subscriptions{{Filter: contract.AckTopic(d.hw), Qos: 1}}})
		typ, _ := d.next()
		require.Equal(t, packets.Suback, typ)
	}
	for _, d := range devices {
		d.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: 2,
			TopicName: contract.ReadingsTopic(d.hw), Payload: gatewaytest.BatchJSON(d.hw, gatewaytest.NewBoot(), 0, 10)})
	}
	for _, d := range devices {
		var puback, ack bool
		for !puback || !ack {
			typ, body := d.next()
			switch typ {
			case packets.Puback:
				puback = true
			case packets.Publish:
				pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Remaining: len(body)}, ProtocolVersion: 4}
				require.NoError(t, pk.PublishDecode(body))
				require.Contains(t, string(pk.Payload), `"status":"accepted"`)
				d.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: pk.PacketID})
				ack = true
			}
		}
	}
	// Each GC shrinks a stack by half at most (where less than a quarter is
	// in use); an idle gateway collects every memory_release_interval.
	for range 3 {
		runtime.GC()
	}
	perConn := (int64(goroutineStackBytes()) - int64(before)) / n
	t.Logf("goroutine stacks per idle connection after three GCs: %d bytes", perConn)
	// Reader 8 KiB and writer 4 KiB or less: mochi's read and write loops
	// hold no packet in their frames while they wait (third_party/README.md,
	// mochi). With the packets in those frames the reader keeps 16 KiB and
	// the writer 8 KiB; without the shrink the reader keeps 32 KiB.
	require.Less(t, perConn, int64(16<<10), "stack bytes per idle connection")
}
