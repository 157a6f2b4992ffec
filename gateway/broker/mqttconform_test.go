package broker_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/gateway/broker"
	"greenhouse-gateway/gateway/ingest"
	"greenhouse-gateway/harness/gatewaytest"
)

// gateStore commits through the buffer set with use, each commit waiting
// for a value on release (or its close), and counts the commits.
type gateStore struct {
	entered chan struct{}
	release chan struct{}
	mu      sync.Mutex
	next    *buffer.Buffer
	commits int
}

func newGateStore() *gateStore {
	return &gateStore{entered: make(chan struct{}, 100), release: make(chan struct{})}
}

// open lets every commit through.
func (s *gateStore) open() *gateStore {
	close(s.release)
	return s
}

func (s *gateStore) use(next *buffer.Buffer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next = next
}

func (s *gateStore) Commit(ctx context.Context, entries []buffer.Entry) ([]buffer.Outcome, error) {
	s.entered <- struct{}{}
	<-s.release
	s.mu.Lock()
	defer s.mu.Unlock()
	s.commits++
	return s.next.Commit(ctx, entries)
}

func (s *gateStore) Submit(ctx context.Context, entries []buffer.Entry) (func() ([]buffer.Outcome, error), error) {
	return ingest.CommitFunc(s.Commit).Submit(ctx, entries)
}

func (s *gateStore) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.commits
}

// startGated runs a hostile-sized gateway whose commits go through s.
func startGated(t *testing.T, s *gateStore) *gatewaytest.Gateway {
	t.Helper()
	h := startHostile(t, hostileOptions{store: s})
	s.use(h.Buf)
	return h
}

// publishPacket is a PUBLISH of the hostile device's readings at qos with
// packet identifier id, with the DUP flag when dup.
func publishPacket(version, qos byte, dup bool, id uint16, payload []byte) []byte {
	first := 0x30 | qos<<1
	if dup {
		first |= 0x08
	}
	body := append(gatewaytest.MQTTString(contract.ReadingsTopic(hostileHW)), byte(id>>8), byte(id))
	if version == 5 {
		body = append(body, 0) // no properties
	}
	return gatewaytest.MQTTPacket(first, append(body, payload...))
}

// ackPacket is a PUBREL (first 0x62) or another packet of a packet
// identifier alone.
func ackPacket(first byte, id uint16) []byte { return []byte{first, 2, byte(id >> 8), byte(id)} }

func write(t *testing.T, c net.Conn, data []byte) {
	t.Helper()
	_, err := c.Write(data)
	require.NoError(t, err)
}

// requireAck reads the next packet and requires it to be of type first,
// for packet identifier id, with reason code success.
func requireAck(t *testing.T, c net.Conn, first byte, id uint16) {
	t.Helper()
	got, body, err := gatewaytest.ReadPacket(c, 20*time.Second)
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("%02X", first), fmt.Sprintf("%02X", got), "packet type")
	require.GreaterOrEqual(t, len(body), 2)
	require.Equal(t, id, binary.BigEndian.Uint16(body))
	if len(body) > 2 {
		require.Equal(t, byte(0), body[2], "reason code success")
	}
}

// requireSilent requires that c receives nothing for a while.
func requireSilent(t *testing.T, c net.Conn, wait time.Duration) {
	t.Helper()
	first, _, err := gatewaytest.ReadPacket(c, wait)
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "nothing arrives (got packet %02X, err %v)", first, err)
}

func forVersions(t *testing.T, run func(t *testing.T, version byte)) {
	for _, v := range []byte{4, 5} {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) { run(t, v) })
	}
}

// TestMQTTQoS2PubrecAfterCommit holds the commit of a QoS 2 batch: no
// PUBREC arrives until the batch is stored, then PUBREL is answered with
// PUBCOMP.
func TestMQTTQoS2PubrecAfterCommit(t *testing.T) {
	forVersions(t, func(t *testing.T, version byte) {
		s := newGateStore()
		h := startGated(t, s)
		c := mqttSession(t, h, version)
		write(t, c, publishPacket(version, 2, false, 7, gatewaytest.BatchJSON(hostileHW, gatewaytest.NewBoot(), 0, 2)))
		select {
		case <-s.entered:
		case <-time.After(20 * time.Second):
			t.Fatal("the batch did not reach the store")
		}
		requireSilent(t, c, 500*time.Millisecond)
		require.EqualValues(t, 0, h.Buf.Stats().PendingBatches)

		close(s.release)
		requireAck(t, c, 0x50, 7) // PUBREC
		require.EqualValues(t, 1, h.Buf.Stats().PendingBatches, "stored before the PUBREC")
		write(t, c, ackPacket(0x62, 7)) // PUBREL
		requireAck(t, c, 0x70, 7)       // PUBCOMP
	})
}

// TestMQTTQoS2RetransmissionStoredOnce resends a QoS 2 PUBLISH with DUP and
// the same packet identifier before PUBREL: it is answered with a PUBREC of
// success and not handled again. After PUBCOMP the same batch under a new
// packet identifier is handled again and stored once.
func TestMQTTQoS2RetransmissionStoredOnce(t *testing.T) {
	forVersions(t, func(t *testing.T, version byte) {
		s := newGateStore().open()
		h := startGated(t, s)
		c := mqttSession(t, h, version)
		batch := gatewaytest.BatchJSON(hostileHW, gatewaytest.NewBoot(), 0, 2)
		write(t, c, publishPacket(version, 2, false, 9, batch))
		requireAck(t, c, 0x50, 9)
		write(t, c, publishPacket(version, 2, true, 9, batch))
		requireAck(t, c, 0x50, 9)
		require.Equal(t, 1, s.count(), "the retransmission is not handled again")
		write(t, c, ackPacket(0x62, 9))
		requireAck(t, c, 0x70, 9)

		write(t, c, publishPacket(version, 2, false, 10, batch))
		requireAck(t, c, 0x50, 10)
		require.Equal(t, 2, s.count())
		require.EqualValues(t, 1, h.Buf.Stats().PendingBatches, "stored once")
	})
}

// TestMQTTQoS2FailedCommitWithholdsPUBREC publishes a QoS 2 batch whose
// commit fails, then a PINGREQ: mochi answers one client's packets in
// order, so the PINGRESP comes after any PUBREC the batch would have had.
func TestMQTTQoS2FailedCommitWithholdsPUBREC(t *testing.T) {
	forVersions(t, func(t *testing.T, version byte) {
		h := startHostile(t, hostileOptions{store: gatewaytest.FailingStore{}})
		c := mqttSession(t, h, version)
		write(t, c, publishPacket(version, 2, false, 5, gatewaytest.BatchJSON(hostileHW, gatewaytest.NewBoot(), 0, 2)))
		write(t, c, []byte{0xC0, 0}) // PINGREQ
		first, _, err := gatewaytest.ReadPacket(c, 20*time.Second)
		require.NoError(t, err)
		require.Equal(t, byte(0xD0), first, "PINGRESP, and no PUBREC before it")
	})
}

// TestMQTTQoS2ReceiveMaximum leaves QoS 2 messages without their PUBREL:
// the broker keeps the state of 16 and disconnects a client that sends
// more (MQTT 5: DISCONNECT 0x93, receive maximum exceeded).
func TestMQTTQoS2ReceiveMaximum(t *testing.T) {
	h := startHostile(t, hostileOptions{})
	c := mqttSession(t, h, 5)
	before := refusedCount(t, h, "protocol_error")
	for id := uint16(1); id <= 16; id++ {
		write(t, c, publishPacket(5, 2, false, id, []byte(`{}`))) // rejected, so no commit: answered at once
		requireAck(t, c, 0x50, id)
	}
	write(t, c, publishPacket(5, 2, false, 17, []byte(`{}`)))
	first, body, err := gatewaytest.ReadPacket(c, 20*time.Second)
	require.NoError(t, err)
	require.Equal(t, byte(0xE0), first, "DISCONNECT")
	require.Equal(t, byte(0x93), body[0], "receive maximum exceeded")
	requireClosed(t, c, 5*time.Second)
	require.Eventually(t, func() bool { return refusedCount(t, h, "protocol_error") == before+1 },
		5*time.Second, 20*time.Millisecond)
}

// TestMQTTQoS2StateNotResumed leaves 16 QoS 2 messages without their
// PUBREL in a persistent session (clean session 0) and reconnects: the
// session is resumed without them (no PUBREC is sent again), a late PUBREL
// is answered with PUBCOMP, a retransmission is handled again and answered
// with PUBREC, and new messages have the full Receive Maximum.
func TestMQTTQoS2StateNotResumed(t *testing.T) {
	s := newGateStore().open()
	h := startGated(t, s)
	persistent := gatewaytest.ConnectPacket(4, hostileHW, hostileHW, gatewaytest.GoodKey)
	persistent[bytes.Index(persistent, []byte("MQTT\x04"))+5] &^= 0x02 // clean session 0
	connect := func() net.Conn {
		c := dialMQTT(t, h)
		write(t, c, persistent)
		first, _, err := gatewaytest.ReadPacket(c, 10*time.Second)
		require.NoError(t, err)
		require.Equal(t, byte(0x20), first, "CONNACK")
		return c
	}
	batch := gatewaytest.BatchJSON(hostileHW, gatewaytest.NewBoot(), 0, 2)
	c := connect()
	for id := uint16(1); id <= 16; id++ {
		write(t, c, publishPacket(4, 2, false, id, batch))
		requireAck(t, c, 0x50, id)
	}
	require.NoError(t, c.Close())

	c = connect()
	requireSilent(t, c, 500*time.Millisecond)
	write(t, c, ackPacket(0x62, 1))
	requireAck(t, c, 0x70, 1)
	write(t, c, publishPacket(4, 2, true, 2, batch))
	requireAck(t, c, 0x50, 2)
	write(t, c, ackPacket(0x62, 2))
	requireAck(t, c, 0x70, 2)
	for id := uint16(100); id < 116; id++ {
		write(t, c, publishPacket(4, 2, false, id, batch))
		requireAck(t, c, 0x50, id)
	}
	require.Equal(t, 16+1+16, s.count(), "every PUBLISH but a retransmission before PUBREL is handled")
	require.EqualValues(t, 1, h.Buf.Stats().PendingBatches)
}

// TestMQTTQoS2StateMemory measures the heap a client's full window of QoS
// 2 messages awaiting PUBREL holds: 16 states of about 850 bytes, without
// the PUBLISH's properties (here a 4 KiB user property on each, which
// acks would otherwise copy and keep).
func TestMQTTQoS2StateMemory(t *testing.T) {
	const clients = 100
	// One hardware_id holds all 2×clients client IDs.
	h := startHostile(t, hostileOptions{mqtt: broker.MQTTConfig{MaxSessionsPerDevice: 2 * clients}})
	user := append(propString(0x26, "k"), gatewaytest.MQTTString(strings.Repeat("v", 4<<10))...)
	publish := func(id uint16) []byte {
		body := append(gatewaytest.MQTTString(contract.ReadingsTopic(hostileHW)), byte(id>>8), byte(id))
		return gatewaytest.MQTTPacket(0x34, append(append(body, props(user)...), "{}"...))
	}
	window := func(pubrel bool) int64 {
		before := heapInUse()
		for i := range clients {
			c := dialMQTT(t, h)
			write(t, c, gatewaytest.ConnectPacket(5, fmt.Sprintf("%s-%v%d", hostileHW, pubrel, i), hostileHW, gatewaytest.GoodKey))
			first, _, err := gatewaytest.ReadPacket(c, 10*time.Second)
			require.NoError(t, err)
			require.Equal(t, byte(0x20), first)
			for id := uint16(1); id <= 16; id++ {
				write(t, c, publish(id))
				requireAck(t, c, 0x50, id)
				if pubrel {
					write(t, c, ackPacket(0x62, id))
					requireAck(t, c, 0x70, id)
				}
			}
		}
		return (heapInUse() - before) / clients
	}
	completed := window(true)
	held := window(false)
	t.Logf("a connection: %d bytes after 16 completed QoS 2 messages, %d with 16 awaiting PUBREL (%d a state)",
		completed, held, (held-completed)/16)
	require.Less(t, held-completed, int64(24<<10), "16 QoS 2 states per client, without the PUBLISH properties")
}

// TestMQTTQoS2StateExpires leaves 16 QoS 2 messages without their PUBREL
// past the broker's maximum message expiry (1 s here): the once-a-second
// sweep drops their states, so a PUBREL is then answered "packet
// identifier not found" (0x92), while the state of the message just
// published is still held and answered success.
func TestMQTTQoS2StateExpires(t *testing.T) {
	h := startHostile(t, hostileOptions{messageExpiry: time.Second})
	c := dialMQTT(t, h)
	write(t, c, gatewaytest.ConnectPacket(5, hostileHW, hostileHW, gatewaytest.GoodKey))
	first, _, err := gatewaytest.ReadPacket(c, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, byte(0x20), first, "CONNACK")
	batch := gatewaytest.BatchJSON(hostileHW, gatewaytest.NewBoot(), 0, 2)
	for id := uint16(1); id <= 16; id++ {
		write(t, c, publishPacket(5, 2, false, id, batch))
		requireAck(t, c, 0x50, id)
	}
	write(t, c, ackPacket(0x62, 16))
	requireAck(t, c, 0x70, 16) // published a moment ago: held
	deadline := time.Now().Add(10 * time.Second)
	for id := uint16(1); ; id++ {
		require.Less(t, id, uint16(16), "every state was still held")
		require.True(t, time.Now().Before(deadline), "no state expired within 10 s")
		time.Sleep(500 * time.Millisecond)
		write(t, c, ackPacket(0x62, id))
		got, body, err := gatewaytest.ReadPacket(c, 10*time.Second)
		require.NoError(t, err)
		require.Equal(t, byte(0x70), got, "PUBCOMP")
		require.Equal(t, id, binary.BigEndian.Uint16(body))
		if len(body) > 2 && body[2] == 0x92 {
			t.Logf("PUBREL %d: state expired", id)
			return
		}
	}
}

// TestMQTTQoS2WithPaho publishes with paho at QoS 2: the token completes
// (PUBREC, PUBREL, PUBCOMP), the ack topic says accepted, and the same
// batch again is answered duplicate.
func TestMQTTQoS2WithPaho(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	d, err := gatewaytest.ConnectDevice(t, h, hwA, gatewaytest.GoodKey)
	require.NoError(t, err)
	batch := gatewaytest.BatchJSON(hwA, gatewaytest.NewBoot(), 0, 2)
	for _, want := range []contract.Status{contract.StatusAccepted, contract.StatusDuplicate} {
		tok := d.Client.Publish(contract.ReadingsTopic(hwA), 2, false, batch)
		require.True(t, tok.WaitTimeout(20*time.Second), "QoS 2 flow completes")
		require.NoError(t, tok.Error())
		require.Equal(t, want, d.NextAck(t).Status)
	}
	require.EqualValues(t, 1, h.Buf.Stats().PendingBatches)
}

// --- CONNECT and AUTH --------------------------------------------------------

func prop1(id, v byte) []byte { return []byte{id, v} }
func prop2(id byte, v uint16) []byte {
	return binary.BigEndian.AppendUint16([]byte{id}, v)
}
func prop4(id byte, v uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte{id}, v)
}
func propString(id byte, s string) []byte { return append([]byte{id}, gatewaytest.MQTTString(s)...) }

func props(ps ...[]byte) []byte {
	var all []byte
	for _, p := range ps {
		all = append(all, p...)
	}
	return append(gatewaytest.MQTTVarint(len(all)), all...)
}

// v5Connect is the hostile device's MQTT 5 CONNECT with the properties
// given (props' encoding) and, when willProps is not nil, a will on its
// readings topic with those will properties and payload; extraFlags are
// set in the connect flags.
func v5Connect(extraFlags byte, connectProps, willProps []byte, willPayload string) []byte {
	flags := 0xC2 | extraFlags
	if willProps != nil {
		flags |= 0x04
	}
	body := append(append(gatewaytest.MQTTString("MQTT"), 5, flags, 0, 60), connectProps...)
	body = append(body, gatewaytest.MQTTString(hostileHW)...)
	if willProps != nil {
		body = append(append(body, willProps...), gatewaytest.MQTTString(contract.ReadingsTopic(hostileHW))...)
		body = append(body, gatewaytest.MQTTString(willPayload)...)
	}
	body = append(append(body, gatewaytest.MQTTString(hostileHW)...), gatewaytest.MQTTString(gatewaytest.GoodKey)...)
	return gatewaytest.MQTTPacket(0x10, body)
}

// TestMQTTConformanceConnect sends CONNECT packets that break the rules of
// MQTT 5 mochi does not check: each is answered with a CONNACK of the
// right reason code, closed and counted; well-formed ones connect.
func TestMQTTConformanceConnect(t *testing.T) {
	h := startHostile(t, hostileOptions{})
	none := props()
	tests := []struct {
		name   string
		packet []byte
		code   byte
		reason string // counted reason
	}{
		{"Receive Maximum 0", v5Connect(0, props(prop2(0x21, 0)), nil, ""), 0x82, "protocol_error"},
		{"Maximum Packet Size 0", v5Connect(0, props(prop4(0x27, 0)), nil, ""), 0x82, "protocol_error"},
		{"Session Expiry Interval twice", v5Connect(0, props(prop4(0x11, 10), prop4(0x11, 10)), nil, ""), 0x82, "protocol_error"},
		{"Receive Maximum twice", v5Connect(0, props(prop2(0x21, 5), prop2(0x21, 5)), nil, ""), 0x82, "protocol_error"},
		{"Request Problem Information 2", v5Connect(0, props(prop1(0x17, 2)), nil, ""), 0x82, "protocol_error"},
		{"Request Response Information 2", v5Connect(0, props(prop1(0x19, 2)), nil, ""), 0x82, "protocol_error"},
		{"Authentication Data without a method", v5Connect(0, props(propString(0x16, "x")), nil, ""), 0x82, "protocol_error"},
		{"Authentication Method", v5Connect(0, props(propString(0x15, "SCRAM-SHA-1")), nil, ""), 0x8C, "bad_auth_method"},
		{"Authentication Method and Data", v5Connect(0, props(propString(0x15, "SCRAM-SHA-1"), propString(0x16, "n,,n=u,r=x")), nil, ""),
			0x8C, "bad_auth_method"},
		{"will Payload Format Indicator 2", v5Connect(0, none, props(prop1(0x01, 2)), "x"), 0x82, "protocol_error"},
		{"will Message Expiry Interval twice", v5Connect(0, none, props(prop4(0x02, 5), prop4(0x02, 5)), "x"), 0x82, "protocol_error"},
		{"will Response Topic with a wildcard", v5Connect(0, none, props(propString(0x08, "a/#")), "x"), 0x82, "protocol_error"},
		{"will declared UTF-8 that is not", v5Connect(0, none, props(prop1(0x01, 1)), "\xff\xfe"), 0x99, "protocol_error"},
		{"Will QoS without the Will Flag", v5Connect(0x08, none, nil, ""), 0x82, "protocol_error"},
		{"reserved connect flag (refused by mochi)", v5Connect(0x01, none, nil, ""), 0x82, "protocol_error"},
		{"Will Retain without the Will Flag (refused by mochi)", v5Connect(0x20, none, nil, ""), 0x82, "protocol_error"},
		{"Receive Maximum 10, Maximum Packet Size 2048, user properties twice",
			v5Connect(0, props(prop2(0x21, 10), prop4(0x27, 2048), propString(0x26, "a"), []byte("\x00\x01b"),
				propString(0x26, "a"), []byte("\x00\x01c")), nil, ""), 0, ""},
		{"will of QoS 2 declared UTF-8", v5Connect(0x10, none, props(prop1(0x01, 1), prop4(0x02, 5)), "é"), 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := map[string]float64{}
			for _, r := range []string{"protocol_error", "bad_auth_method"} {
				before[r] = refusedCount(t, h, r)
			}
			c := dialMQTT(t, h)
			write(t, c, tt.packet)
			first, body, err := gatewaytest.ReadPacket(c, 10*time.Second)
			require.NoError(t, err)
			require.Equal(t, byte(0x20), first, "CONNACK")
			require.Equal(t, fmt.Sprintf("0x%02X", tt.code), fmt.Sprintf("0x%02X", body[1]), "CONNACK reason code")
			for r, n := range before {
				want := n
				if r == tt.reason {
					want++
				}
				require.Equal(t, want, refusedCount(t, h, r), r)
			}
			if tt.code == 0 {
				write(t, c, []byte{0xE0, 0}) // DISCONNECT
			}
			requireClosed(t, c, 5*time.Second)
		})
	}
}

// TestMQTTConformanceConnectClosed sends CONNECT packets that are closed
// without a CONNACK, and counted: a 3.1.1 CONNECT that breaks a rule
// ([MQTT-3.1.4-1]), and CONNECT packets that do not decode.
func TestMQTTConformanceConnectClosed(t *testing.T) {
	h := startHostile(t, hostileOptions{})
	willQoS := gatewaytest.ConnectPacket(4, hostileHW, hostileHW, gatewaytest.GoodKey)
	willQoS[bytes.Index(willQoS, []byte("MQTT\x04"))+5] |= 0x08 // Will QoS 1 without the Will Flag
	for _, tt := range []struct {
		name, reason string
		packet       []byte
	}{
		{"3.1.1 Will QoS without the Will Flag", "protocol_error", willQoS},
		{"empty CONNECT", "malformed", []byte{0x10, 0}},
		{"v5 CONNECT with properties longer than the packet", "malformed",
			gatewaytest.MQTTPacket(0x10, append(gatewaytest.MQTTString("MQTT"), 5, 0xC2, 0, 60, 0x7F))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := refusedCount(t, h, tt.reason)
			mqttClosedCase(0, tt.packet)(t, h)
			require.Equal(t, before+1, refusedCount(t, h, tt.reason))
		})
	}
}

// TestMQTTConformanceAuth sends AUTH packets after a CONNECT without an
// Authentication Method: MQTT 5 answers DISCONNECT 0x82 and closes; 3.1.1,
// where the packet type is reserved, closes.
func TestMQTTConformanceAuth(t *testing.T) {
	h := startHostile(t, hostileOptions{})
	for _, tt := range []struct {
		name   string
		packet []byte
	}{
		{"empty", []byte{0xF0, 0}},
		{"success", []byte{0xF0, 1, 0}},
		{"continue, no properties", []byte{0xF0, 2, 0x18, 0}},
		{"re-authenticate with a method", gatewaytest.MQTTPacket(0xF0, append([]byte{0x19}, props(propString(0x15, "SCRAM-SHA-1"))...))},
	} {
		t.Run("v5 "+tt.name, func(t *testing.T) {
			before := refusedCount(t, h, "protocol_error")
			c := mqttSession(t, h, 5)
			write(t, c, tt.packet)
			first, body, err := gatewaytest.ReadPacket(c, 10*time.Second)
			require.NoError(t, err)
			require.Equal(t, byte(0xE0), first, "DISCONNECT")
			require.Equal(t, byte(0x82), body[0], "protocol error")
			requireClosed(t, c, 5*time.Second)
			require.Eventually(t, func() bool { return refusedCount(t, h, "protocol_error") == before+1 },
				5*time.Second, 20*time.Millisecond)
		})
	}
	t.Run("v3 success", func(t *testing.T) { mqttClosedCase(4, []byte{0xF0, 1, 0})(t, h) })
}

// TestMQTTConformanceMalformed sends packets mochi does not decode after an
// MQTT 5 CONNECT: each is answered with DISCONNECT and the reason code of
// the decoding error, then the close, and counted; in 3.1.1 the connection
// is closed without a word.
func TestMQTTConformanceMalformed(t *testing.T) {
	h := startHostile(t, hostileOptions{})
	// publish is a PUBLISH of "{}" on topic with packet identifier 1 (and
	// no properties in MQTT 5).
	publish := func(first byte, topic string) func(version byte) []byte {
		return func(version byte) []byte {
			body := append(gatewaytest.MQTTString(topic), 0, 1)
			if version == 5 {
				body = append(body, 0)
			}
			return gatewaytest.MQTTPacket(first, append(body, "{}"...))
		}
	}
	for _, tt := range []struct {
		name   string
		packet func(version byte) []byte
		code   byte
		reason string
		v5only bool // valid in 3.1.1
	}{
		{"PUBLISH of QoS 3", publish(0x36, contract.ReadingsTopic(hostileHW)), 0x82, "protocol_error", false},
		{"PUBLISH with a topic that is not UTF-8", publish(0x32, "devices/\xff"), 0x81, "malformed", false},
		{"PUBLISH with properties longer than the packet", func(byte) []byte {
			return gatewaytest.MQTTPacket(0x30, append(gatewaytest.MQTTString("a"), 0x7F))
		}, 0x81, "malformed", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := refusedCount(t, h, tt.reason)
			c := mqttSession(t, h, 5)
			write(t, c, tt.packet(5))
			first, body, err := gatewaytest.ReadPacket(c, 10*time.Second)
			require.NoError(t, err)
			require.Equal(t, byte(0xE0), first, "DISCONNECT")
			require.Equal(t, fmt.Sprintf("0x%02X", tt.code), fmt.Sprintf("0x%02X", body[0]))
			requireClosed(t, c, 5*time.Second)
			require.Eventually(t, func() bool { return refusedCount(t, h, tt.reason) == before+1 },
				5*time.Second, 20*time.Millisecond)
		})
		if !tt.v5only {
			t.Run("v3 "+tt.name, func(t *testing.T) {
				before := refusedCount(t, h, tt.reason)
				mqttClosedCase(4, tt.packet(4))(t, h)
				// Counted too, before the next case reads the count.
				require.Eventually(t, func() bool { return refusedCount(t, h, tt.reason) == before+1 },
					5*time.Second, 20*time.Millisecond)
			})
		}
	}
}
