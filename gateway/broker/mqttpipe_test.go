package broker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/gateway/ingest"
	"greenhouse-gateway/harness/gatewaytest"
)

// heldStore queues commits like the buffer's Submit, but holds each one
// until the test releases it (then commits it to the real buffer, or fails
// it).
type heldStore struct {
	buf *buffer.Buffer

	mu    sync.Mutex
	calls []*heldCommit
}

type heldCommit struct {
	batchID string
	release chan error
}

func (s *heldStore) Submit(ctx context.Context, entries []buffer.Entry) (func() ([]buffer.Outcome, error), error) {
	c := &heldCommit{batchID: entries[0].BatchID, release: make(chan error, 1)}
	s.mu.Lock()
	s.calls = append(s.calls, c)
	s.mu.Unlock()
	return func() ([]buffer.Outcome, error) {
		if err := <-c.release; err != nil {
			return nil, err
		}
		return s.buf.Commit(ctx, entries)
	}, nil
}

// submitted returns the batch IDs queued so far, in order.
func (s *heldStore) submitted() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, len(s.calls))
	for i, c := range s.calls {
		ids[i] = c.batchID
	}
	return ids
}

// release lets the i-th queued commit go on (err: it fails).
func (s *heldStore) release(i int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[i].release <- err
}

// releaseAll fails every commit not released yet.
func (s *heldStore) releaseAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.calls {
		select {
		case c.release <- errors.New("test over"):
		default:
		}
	}
}

func startHeld(t *testing.T) (*heldStore, *gatewaytest.Device) {
	t.Helper()
	store := &heldStore{}
	h := gatewaytest.Start(t, store)
	store.buf = h.Buf
	t.Cleanup(store.releaseAll) // nothing left held when the gateway stops
	d, err := gatewaytest.ConnectDevice(t, h, hwA, gatewaytest.GoodKey)
	require.NoError(t, err)
	return store, d
}

func tokenDone(tok paho.Token) bool {
	select {
	case <-tok.Done():
		return true
	default:
		return false
	}
}

func assertNoAckYet(t *testing.T, d *gatewaytest.Device, tokens []paho.Token, wait time.Duration) {
	t.Helper()
	select {
	case a := <-d.Acks:
		t.Fatalf("ack before its turn: %+v", a)
	case <-time.After(wait):
	}
	for i, tok := range tokens {
		require.False(t, tokenDone(tok), "PUBACK %d before its turn", i)
	}
}

// A device's next messages are read and queued for the group commit while
// the first one's commit is under way; every answer still waits for its
// own commit, and they go out in the order the messages came.
func TestMQTTMessagesQueueBehindACommitAndAreAnsweredInOrder(t *testing.T) {
	store, d := startHeld(t)
	boot := gatewaytest.NewBoot()
	var ids []string
	var tokens []paho.Token
	for i := range 3 {
		payload := gatewaytest.BatchJSON(hwA, boot, i, 2)
		ids = append(ids, gatewaytest.BatchIDOf(t, payload))
		tokens = append(tokens, d.Publish(payload))
	}
	gatewaytest.WaitFor(t, 10*time.Second, "all three queued", func() bool { return len(store.submitted()) == 3 })
	require.Equal(t, ids, store.submitted(), "queued in the order published")
	assertNoAckYet(t, d, tokens, 200*time.Millisecond)

	// The later commits finish first: still nothing is answered.
	store.release(2, nil)
	store.release(1, nil)
	assertNoAckYet(t, d, tokens, 300*time.Millisecond)

	store.release(0, nil)
	for i, id := range ids {
		a := d.NextAck(t)
		require.Equal(t, id, a.BatchID, "ack %d in order", i)
		require.Equal(t, contract.StatusAccepted, a.Status)
		require.True(t, tokens[i].WaitTimeout(10*time.Second), "PUBACK %d", i)
		require.NoError(t, tokens[i].Error())
	}
	require.EqualValues(t, 3, store.buf.Stats().PendingBatches)
}

// A commit that fails withholds only its own PUBACK; the messages behind
// it are answered.
func TestMQTTFailedCommitWithholdsOnlyItsPUBACK(t *testing.T) {
	store, d := startHeld(t)
	boot := gatewaytest.NewBoot()
	first := gatewaytest.BatchJSON(hwA, boot, 0, 2)
	second := gatewaytest.BatchJSON(hwA, boot, 1, 2)
	t1, t2 := d.Publish(first), d.Publish(second)
	gatewaytest.WaitFor(t, 10*time.Second, "both queued", func() bool { return len(store.submitted()) == 2 })
	store.release(0, errors.New("injected: input/output error"))
	store.release(1, nil)

	a := d.NextAck(t)
	require.Equal(t, gatewaytest.BatchIDOf(t, first), a.BatchID)
	require.Equal(t, contract.StatusRejected, a.Status)
	require.Equal(t, contract.ReasonBufferFull, *a.Reason, "the device is told to keep it")
	a = d.NextAck(t)
	require.Equal(t, gatewaytest.BatchIDOf(t, second), a.BatchID)
	require.Equal(t, contract.StatusAccepted, a.Status)
	require.True(t, t2.WaitTimeout(10*time.Second))
	require.NoError(t, t2.Error())
	require.False(t, tokenDone(t1), "no PUBACK for the batch that was not stored")
	_, err := store.buf.Lookup(gatewaytest.BatchIDOf(t, first))
	require.ErrorIs(t, err, buffer.ErrNotFound, "not stored")
}

// A connection has at most a bounded number of messages waiting for their
// commit; mochi reads no more of it until one is answered.
func TestMQTTDeferredMessagesPerConnectionAreBounded(t *testing.T) {
	store, d := startHeld(t)
	boot := gatewaytest.NewBoot()
	const n = 12 // more than ingest's bound of 8
	var tokens []paho.Token
	for i := range n {
		tokens = append(tokens, d.Publish(gatewaytest.BatchJSON(hwA, boot, i, 1)))
	}
	gatewaytest.WaitFor(t, 10*time.Second, "the first 8 queued", func() bool { return len(store.submitted()) == 8 })
	time.Sleep(300 * time.Millisecond)
	require.Len(t, store.submitted(), 8, "no more read while 8 wait")

	store.release(0, nil)
	gatewaytest.WaitFor(t, 10*time.Second, "one more queued once one is answered", func() bool { return len(store.submitted()) == 9 })
	for i := 1; i < n; i++ {
		gatewaytest.WaitFor(t, 10*time.Second, "queued", func() bool { return len(store.submitted()) > i })
		store.release(i, nil)
	}
	for i, tok := range tokens {
		require.True(t, tok.WaitTimeout(10*time.Second), "PUBACK %d", i)
		require.NoError(t, tok.Error())
	}
	require.EqualValues(t, n, store.buf.Stats().PendingBatches)
}

// A registration is saved before the next message is read, but answered
// after the readings before it.
func TestMQTTRegistrationIsAnsweredAfterTheReadingsBeforeIt(t *testing.T) {
	store, d := startHeld(t)
	boot := gatewaytest.NewBoot()
	reading := gatewaytest.BatchJSON(hwA, boot, 0, 2)
	tr := d.Publish(reading)
	gatewaytest.WaitFor(t, 10*time.Second, "the reading queued", func() bool { return len(store.submitted()) == 1 })
	treg := d.Client.Publish(contract.RegisterTopic(hwA), 1, false, gatewaytest.Registration(hwA, boot))
	assertNoAckYet(t, d, []paho.Token{tr, treg}, 300*time.Millisecond)

	store.release(0, nil)
	a := d.NextAck(t)
	require.Equal(t, contract.AckTypeReadings, a.Type)
	require.Equal(t, gatewaytest.BatchIDOf(t, reading), a.BatchID)
	a = d.NextAck(t)
	require.Equal(t, contract.AckTypeRegister, a.Type)
	require.Equal(t, contract.StatusRegistered, a.Status)
	for _, tok := range []paho.Token{tr, treg} {
		require.True(t, tok.WaitTimeout(10*time.Second))
		require.NoError(t, tok.Error())
	}
}

// A device that publishes and never reads its socket fills its outbound
// queue with answers and is disconnected; it never holds the answerer it
// shares with others: every other device is still answered, and the
// gateway still stops.
func TestMQTTADeviceThatDoesNotReadHoldsNoOtherDevice(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	stuckHW := "AA:BB:CC:DE:00:01"
	d := net.Dialer{Timeout: 10 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { // a small window, so that it fills soon
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		return errors.Join(err, serr)
	}}
	c, err := d.Dial("tcp", strings.TrimPrefix(h.MQTTAddr, "tcp://"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() }) // after the gateway stopped: it did not wait for this device
	write := func(pk packets.Packet) error {
		b, err := encodePacket(pk)
		if err == nil {
			_ = c.SetWriteDeadline(time.Now().Add(30 * time.Second))
			_, err = c.Write(b)
		}
		return err
	}
	require.NoError(t, write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 4,
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), Clean: true, Keepalive: 600, ClientIdentifier: stuckHW,
			UsernameFlag: true, Username: []byte(stuckHW), PasswordFlag: true, Password: []byte(gatewaytest.GoodKey)}}))
	require.NoError(t, write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1}, PacketID: 1,
		Filters: packets.Subscriptions{{Filter: contract.AckTopic(stuckHW), Qos: 0}}}))
	// From here on it only writes: QoS 1 readings, at most 100,000, until
	// the gateway stops reading it.
	boot := gatewaytest.NewBoot()
	go func() {
		for i := range 100_000 {
			err := write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: uint16(i%60_000 + 2),
				TopicName: contract.ReadingsTopic(stuckHW), Payload: gatewaytest.BatchJSON(stuckHW, boot, i, 1)})
			if err != nil {
				return
			}
		}
	}()
	stored, still := int64(-1), 0
	for deadline := time.Now().Add(60 * time.Second); still < 3; {
		require.True(t, time.Now().Before(deadline), "the device that does not read was never stopped")
		time.Sleep(500 * time.Millisecond)
		if n := h.Buf.Stats().PendingBatches; n == stored {
			still++
		} else {
			stored, still = n, 0
		}
	}
	t.Logf("the device that does not read was stopped after %d batches stored", stored)
	require.Positive(t, stored)

	// Connections are spread over the answerers in turn: these cover all.
	for i := range max(2, runtime.GOMAXPROCS(0)) + 2 {
		hw := fmt.Sprintf("AA:BB:CC:DE:01:%02X", i)
		dev, err := gatewaytest.ConnectDevice(t, h, hw, gatewaytest.GoodKey)
		require.NoError(t, err)
		payload := gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), 0, 1)
		tok := dev.Publish(payload)
		require.True(t, tok.WaitTimeout(10*time.Second), "%s answered", hw)
		require.NoError(t, tok.Error())
		a := dev.NextAck(t)
		require.Equal(t, gatewaytest.BatchIDOf(t, payload), a.BatchID)
		require.Equal(t, contract.StatusAccepted, a.Status)
	}

	// The gateway closed it: what it had sent ends in EOF.
	require.NoError(t, c.SetReadDeadline(time.Now().Add(20*time.Second)))
	_, err = io.Copy(io.Discard, c)
	require.NoError(t, err, "disconnected, not held")
}

// At QoS 2 the PUBREC waits for the commit too, and the flow completes
// (PUBREL, PUBCOMP) once it is sent.
func TestMQTTQoS2ReadingIsAnsweredAfterItsCommit(t *testing.T) {
	store, d := startHeld(t)
	payload := gatewaytest.BatchJSON(hwA, gatewaytest.NewBoot(), 0, 2)
	tok := d.Client.Publish(contract.ReadingsTopic(hwA), 2, false, payload)
	gatewaytest.WaitFor(t, 10*time.Second, "queued", func() bool { return len(store.submitted()) == 1 })
	assertNoAckYet(t, d, []paho.Token{tok}, 300*time.Millisecond)
	store.release(0, nil)
	require.True(t, tok.WaitTimeout(10*time.Second), "PUBCOMP")
	require.NoError(t, tok.Error())
	a := d.NextAck(t)
	require.Equal(t, gatewaytest.BatchIDOf(t, payload), a.BatchID)
	require.Equal(t, contract.StatusAccepted, a.Status)
	require.EqualValues(t, 1, store.buf.Stats().PendingBatches)
}

// refusingStore queues nothing: its Submit fails (a buffer closed or
// failed).
type refusingStore struct{}

func (refusingStore) Submit(context.Context, []buffer.Entry) (func() ([]buffer.Outcome, error), error) {
	return nil, buffer.ErrClosed
}

// A batch that could not even be queued is answered as a failed commit:
// buffer_full, no acknowledgement, and the ingest call ends (Close does
// not wait for it).
func TestReadingsNotQueuedAreNotAcknowledged(t *testing.T) {
	in, err := ingest.New(ingest.Config{}, ingest.Deps{Store: refusingStore{}, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	payload := gatewaytest.BatchJSON(hwA, gatewaytest.NewBoot(), 0, 2)
	res, err := in.Readings(context.Background(), ingest.Sender{}, [][]byte{payload})
	require.ErrorIs(t, err, buffer.ErrClosed)
	require.Equal(t, contract.StatusRejected, res[0].Status)
	require.Equal(t, contract.ReasonBufferFull, *res[0].Reason)
	ack, ok := in.MQTTMessage(context.Background(), ingest.Sender{HardwareID: hwA}, contract.KindReadings, payload)
	require.False(t, ok, "no MQTT acknowledgement")
	require.Equal(t, contract.ReasonBufferFull, *ack.Reason)
	closed := make(chan error, 1)
	go func() { closed <- in.Close() }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Close waits for a call that ended")
	}
}

// A QoS 0 message is answered after the QoS 1 messages before it: its ack
// comes after theirs.
func TestMQTTQoS0ReadingIsAnsweredAfterTheOnesBeforeIt(t *testing.T) {
	store, d := startHeld(t)
	boot := gatewaytest.NewBoot()
	first := gatewaytest.BatchJSON(hwA, boot, 0, 2)
	tok := d.Publish(first)
	gatewaytest.WaitFor(t, 10*time.Second, "the first queued", func() bool { return len(store.submitted()) == 1 })
	second := gatewaytest.BatchJSON(hwA, boot, 1, 2)
	d.Client.Publish(contract.ReadingsTopic(hwA), 0, false, second)
	assertNoAckYet(t, d, []paho.Token{tok}, 300*time.Millisecond)
	require.Len(t, store.submitted(), 1, "the QoS 0 message waits")

	store.release(0, nil)
	gatewaytest.WaitFor(t, 10*time.Second, "the second queued", func() bool { return len(store.submitted()) == 2 })
	store.release(1, nil)
	require.Equal(t, gatewaytest.BatchIDOf(t, first), d.NextAck(t).BatchID)
	require.Equal(t, gatewaytest.BatchIDOf(t, second), d.NextAck(t).BatchID)
	require.True(t, tok.WaitTimeout(10*time.Second))
}

// A device that resumed its session (its ack subscription kept) publishes
// at QoS 2: its packet IDs and those of the acks the gateway publishes to
// it count from 1 alike, and more messages than the receive maximum all
// complete. (Had the ack-topic message taken a PUBREC's ID, the PUBREC's
// state could be gone before the PUBREL and its receive quota never given
// back; whether that happens depends on the order in which the client
// answers the two, so this test may pass without the fix.)
func TestMQTTQoS2ReadingsOfAResumedSessionKeepTheirState(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	const clientID = hwA
	first := connectListener(t, h, clientID, hwA, true)
	first.leave()
	l := connectListener(t, h, clientID, hwA, false)
	require.True(t, l.present, "the session with its subscription resumed")
	boot := gatewaytest.NewBoot()
	const n = 40 // more than the receive maximum of 16
	for i := range n {
		tok := l.client.Publish(contract.ReadingsTopic(hwA), 2, false, gatewaytest.BatchJSON(hwA, boot, i, 1))
		require.True(t, tok.WaitTimeout(10*time.Second), "message %d: PUBCOMP", i)
		require.NoError(t, tok.Error(), "message %d", i)
	}
	require.Len(t, l.collect(time.Second), n, "an ack for each")
	require.True(t, l.client.IsConnectionOpen(), "still connected")
	require.EqualValues(t, n, h.Buf.Stats().PendingBatches)
}

// encodePacket encodes a packet a raw test client sends.
func encodePacket(pk packets.Packet) ([]byte, error) {
	var b bytes.Buffer
	var err error
	switch pk.FixedHeader.Type {
	case packets.Connect:
		err = pk.ConnectEncode(&b)
	case packets.Subscribe:
		err = pk.SubscribeEncode(&b)
	case packets.Publish:
		err = pk.PublishEncode(&b)
	case packets.Puback:
		err = pk.PubackEncode(&b)
	default:
		err = fmt.Errorf("no encoder for packet type %d", pk.FixedHeader.Type)
	}
	return b.Bytes(), err
}
