package broker_test

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/gateway/broker"
	"greenhouse-gateway/harness/gatewaytest"
)

// sessionMetric returns a gateway_mqtt_* series' value: a gauge, or a
// counter with one label whose value is label.
func sessionMetric(t testing.TB, h *gatewaytest.Gateway, name, label string) float64 {
	t.Helper()
	mfs, err := h.Reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "gateway_mqtt_"+name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetGauge() != nil && label == "" {
				return m.GetGauge().GetValue()
			}
			if len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == label {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// requireMetric waits until sessionMetric is want.
func requireMetric(t *testing.T, h *gatewaytest.Gateway, name, label string, want float64) {
	t.Helper()
	require.Eventually(t, func() bool { return sessionMetric(t, h, name, label) == want }, 15*time.Second, 20*time.Millisecond,
		"gateway_mqtt_%s{%s} is %v, want %v", name, label, func() float64 { return sessionMetric(t, h, name, label) }(), want)
}

// listener is an MQTT 3.1.1 client with a persistent session (clean session
// false) under clientID, subscribed to hw's ack topic.
type listener struct {
	client  paho.Client
	acks    chan contract.Ack
	present bool
}

// connectListener connects clientID with clean session false; the acks of
// its session arrive on acks, those queued while it was away included.
func connectListener(t *testing.T, h *gatewaytest.Gateway, clientID, hw string, subscribe bool) *listener {
	t.Helper()
	l := &listener{acks: make(chan contract.Ack, 1000)}
	opts := paho.NewClientOptions().AddBroker(h.MQTTAddr).SetClientID(clientID).SetUsername(hw).SetPassword(gatewaytest.GoodKey).
		SetCleanSession(false).SetAutoReconnect(false).SetConnectRetry(false).SetConnectTimeout(10 * time.Second).
		SetDefaultPublishHandler(func(_ paho.Client, m paho.Message) {
			var a contract.Ack
			if json.Unmarshal(m.Payload(), &a) == nil {
				l.acks <- a
			}
		})
	l.client = paho.NewClient(opts)
	tok := l.client.Connect()
	require.True(t, tok.WaitTimeout(20*time.Second))
	require.NoError(t, tok.Error())
	l.present = tok.(*paho.ConnectToken).SessionPresent()
	t.Cleanup(func() { l.client.Disconnect(0) })
	if subscribe {
		sub := l.client.Subscribe(contract.AckTopic(hw), 1, nil)
		require.True(t, sub.WaitTimeout(20*time.Second))
		require.NoError(t, sub.Error())
	}
	return l
}

// leave disconnects, leaving the session offline on the broker.
func (l *listener) leave() { l.client.Disconnect(50) }

// collect returns the batch IDs of the acks that arrive until none has for
// quiet.
func (l *listener) collect(quiet time.Duration) []string {
	var ids []string
	for {
		select {
		case a := <-l.acks:
			ids = append(ids, a.BatchID)
		case <-time.After(quiet):
			return ids
		}
	}
}

// persistentSessions leaves n offline persistent sessions HW-1 ... HW-n
// subscribed to hw's ack topic, one after the other: each is offline (or
// ended by a cap) before the next leaves.
func persistentSessions(t *testing.T, h *gatewaytest.Gateway, hw string, n int) {
	t.Helper()
	gone := func() float64 {
		n := sessionMetric(t, h, "offline_sessions", "")
		for _, r := range []string{"expiry", "device_cap", "session_cap", "budget"} {
			n += sessionMetric(t, h, "sessions_expired_total", r)
		}
		return n
	}
	for i := 1; i <= n; i++ {
		before := gone()
		connectListener(t, h, fmt.Sprintf("%s-%d", hw, i), hw, true).leave()
		require.Eventually(t, func() bool { return gone() == before+1 }, 10*time.Second, 5*time.Millisecond)
	}
}

// sendBatches publishes n batches as hw (a clean session) and waits for
// each ack; it returns their batch IDs in order.
func sendBatches(t *testing.T, h *gatewaytest.Gateway, hw string, n int) []string {
	t.Helper()
	d, err := gatewaytest.ConnectDevice(t, h, hw, gatewaytest.GoodKey)
	require.NoError(t, err)
	boot := gatewaytest.NewBoot()
	var ids []string
	for i := range n {
		tok := d.Publish(gatewaytest.BatchJSON(hw, boot, i, 1))
		require.True(t, tok.WaitTimeout(20*time.Second))
		require.NoError(t, tok.Error())
		a := d.NextAck(t)
		require.Equal(t, contract.StatusAccepted, a.Status)
		ids = append(ids, a.BatchID)
	}
	d.Client.Disconnect(50)
	return ids
}

func TestOfflineSessionExpires(t *testing.T) {
	// Long enough for the acks to be queued before mochi's once-a-second
	// sweep (whole seconds) expires the session.
	h, mqttBroker := startHostileBroker(t, hostileOptions{mqtt: broker.MQTTConfig{SessionExpiry: 3 * time.Second}})
	persistentSessions(t, h, "5E:55:00:00:00:01", 1)
	requireMetric(t, h, "offline_sessions", "", 1)
	sendBatches(t, h, "5E:55:00:00:00:01", 3)
	requireMetric(t, h, "queued_messages", "", 3)
	ackTopic := contract.AckTopic("5E:55:00:00:00:01")
	// The clean session of sendBatches leaves the index once the broker has
	// handled its DISCONNECT, after Disconnect returned.
	require.Eventually(t, func() bool {
		return slices.Equal([]string{"5E:55:00:00:00:01-1"}, broker.TopicSubscribers(mqttBroker, ackTopic))
	}, 10*time.Second, 5*time.Millisecond, "only the persistent session subscribes")

	requireMetric(t, h, "offline_sessions", "", 0)
	requireMetric(t, h, "queued_messages", "", 0)
	requireMetric(t, h, "queued_bytes", "", 0)
	requireMetric(t, h, "session_state_bytes", "", 0)
	requireMetric(t, h, "sessions_expired_total", "expiry", 1)
	require.Empty(t, broker.TopicSubscribers(mqttBroker, ackTopic), "the expired session's subscription is gone")
	l := connectListener(t, h, "5E:55:00:00:00:01-1", "5E:55:00:00:00:01", false)
	require.False(t, l.present, "the session expired")
	require.Empty(t, l.collect(500*time.Millisecond), "nothing of the expired session is delivered")
}

func TestQueuedAcksShedTheOldest(t *testing.T) {
	const limit, sent = 5, 20
	h := startHostile(t, hostileOptions{mqtt: broker.MQTTConfig{MaxQueuedPerClient: limit}})
	persistentSessions(t, h, "5E:55:00:00:00:02", 1)
	ids := sendBatches(t, h, "5E:55:00:00:00:02", sent)
	requireMetric(t, h, "queued_messages", "", limit)
	require.Equal(t, float64(sent-limit), sessionMetric(t, h, "messages_shed_total", "client_cap"))
	var held int64
	for _, id := range ids[sent-limit:] {
		held += broker.QueuedMessageBytes(contract.AckTopic("5E:55:00:00:00:02"), contract.EncodeAck(contract.Ack{
			Type: contract.AckTypeReadings, BatchID: id, Status: contract.StatusAccepted}))
	}
	require.Equal(t, float64(held), sessionMetric(t, h, "queued_bytes", ""), "payload, topic and overhead of each")

	l := connectListener(t, h, "5E:55:00:00:00:02-1", "5E:55:00:00:00:02", false)
	require.True(t, l.present)
	got := l.collect(time.Second)
	require.ElementsMatch(t, ids[sent-limit:], got, "the newest acks are kept, the oldest shed")
	requireMetric(t, h, "queued_messages", "", 0)
	requireMetric(t, h, "offline_sessions", "", 0)

	l.client.Disconnect(50)
	requireMetric(t, h, "offline_sessions", "", 1)
	require.Equal(t, 0.0, sessionMetric(t, h, "queued_bytes", ""))
}

func TestOfflineSessionCaps(t *testing.T) {
	h := startHostile(t, hostileOptions{mqtt: broker.MQTTConfig{MaxOfflineSessionsPerDevice: 2, MaxOfflineSessions: 3}})
	persistentSessions(t, h, "5E:55:00:00:00:03", 3) // SESS-A-1 ends: three for one device
	requireMetric(t, h, "sessions_expired_total", "device_cap", 1)
	requireMetric(t, h, "offline_sessions", "", 2)
	persistentSessions(t, h, "5E:55:00:00:00:04", 2) // SESS-A-2 ends: four in all
	requireMetric(t, h, "sessions_expired_total", "session_cap", 1)
	requireMetric(t, h, "offline_sessions", "", 3)

	// The kept ones first: a new session made by looking for an ended one
	// would end another.
	for _, c := range []struct {
		id   string
		kept bool
	}{{"5E:55:00:00:00:03-3", true}, {"5E:55:00:00:00:04-1", true}, {"5E:55:00:00:00:04-2", true},
		{"5E:55:00:00:00:03-1", false}, {"5E:55:00:00:00:03-2", false}} {
		l := connectListener(t, h, c.id, c.id[:17], false)
		require.Equal(t, c.kept, l.present, "%s's session kept", c.id)
		l.client.Disconnect(50)
	}
}

func TestSessionStateStaysWithinBudget(t *testing.T) {
	const budget, sessions, batches = 1 << 20, 30, 60
	h := startHostile(t, hostileOptions{mqtt: broker.MQTTConfig{SessionMemory: budget, MaxQueuedPerClient: 1000,
		MaxOfflineSessionsPerDevice: 100}})
	persistentSessions(t, h, "5E:55:00:00:00:05", sessions)
	requireMetric(t, h, "offline_sessions", "", sessions)
	d, err := gatewaytest.ConnectDevice(t, h, "5E:55:00:00:00:05", gatewaytest.GoodKey)
	require.NoError(t, err)
	boot := gatewaytest.NewBoot()
	var ids []string
	for i := range batches {
		tok := d.Publish(gatewaytest.BatchJSON("5E:55:00:00:00:05", boot, i, 1))
		require.True(t, tok.WaitTimeout(20*time.Second))
		require.NoError(t, tok.Error())
		ids = append(ids, d.NextAck(t).BatchID)
		require.LessOrEqual(t, sessionMetric(t, h, "session_state_bytes", ""), float64(budget))
	}
	require.Greater(t, sessionMetric(t, h, "messages_shed_total", "budget"), 0.0)
	require.Equal(t, float64(sessions), sessionMetric(t, h, "offline_sessions", ""), "messages are shed before sessions")

	// Each session lost its oldest acks: what it still holds are the newest.
	l := connectListener(t, h, "5E:55:00:00:00:05-7", "5E:55:00:00:00:05", false)
	require.True(t, l.present)
	got := l.collect(time.Second)
	require.NotEmpty(t, got)
	require.Less(t, len(got), batches)
	require.ElementsMatch(t, ids[batches-len(got):], got)
}

func TestBudgetEndsTheSessionsOfflineLongest(t *testing.T) {
	// Offline sessions without messages: only ending sessions frees memory.
	h, b := startHostileBroker(t, hostileOptions{mqtt: broker.MQTTConfig{SessionMemory: 1 << 20, MaxOfflineSessionsPerDevice: 1000}})
	fit := int((1 << 20) / broker.OfflineSessionBytes(b))
	persistentSessions(t, h, "5E:55:00:00:00:06", fit+3)
	requireMetric(t, h, "sessions_expired_total", "budget", 3)
	requireMetric(t, h, "offline_sessions", "", float64(fit))
	require.LessOrEqual(t, sessionMetric(t, h, "session_state_bytes", ""), float64(1<<20))
	l := connectListener(t, h, "5E:55:00:00:00:06-3", "5E:55:00:00:00:06", false)
	require.False(t, l.present, "the sessions offline longest ended")
	l = connectListener(t, h, "5E:55:00:00:00:06-4", "5E:55:00:00:00:06", false)
	require.True(t, l.present)
}

// connect5 is an MQTT 5 CONNECT with username, password, clean start and a
// Session Expiry Interval.
func connect5(clientID, user, pass string, expiry uint32) []byte {
	body := append(gatewaytest.MQTTString("MQTT"), 5, 0xC2, 0, 60)
	body = append(body, 5, 0x11)
	body = binary.BigEndian.AppendUint32(body, expiry)
	body = append(body, gatewaytest.MQTTString(clientID)...)
	body = append(body, gatewaytest.MQTTString(user)...)
	body = append(body, gatewaytest.MQTTString(pass)...)
	return gatewaytest.MQTTPacket(0x10, body)
}

// connackSessionExpiry returns the Session Expiry Interval property of an
// MQTT 5 CONNACK body, if it has one.
func connackSessionExpiry(t *testing.T, body []byte) (uint32, bool) {
	t.Helper()
	require.GreaterOrEqual(t, len(body), 3)
	require.Equal(t, byte(0), body[1], "CONNACK success")
	props := body[2:]
	n, shift, i := 0, 0, 0
	for ; ; i++ {
		n |= int(props[i]&0x7f) << shift
		shift += 7
		if props[i]&0x80 == 0 {
			break
		}
	}
	props = props[i+1 : i+1+n]
	sizes := map[byte]int{0x11: 4, 0x21: 2, 0x22: 2, 0x13: 2, 0x24: 1, 0x25: 1, 0x27: 4, 0x28: 1, 0x29: 1, 0x2A: 1}
	for len(props) > 0 {
		id := props[0]
		props = props[1:]
		size, fixed := sizes[id]
		if !fixed { // a string or binary property
			size = 2 + int(binary.BigEndian.Uint16(props))
		}
		if id == 0x11 {
			return binary.BigEndian.Uint32(props), true
		}
		props = props[size:]
	}
	return 0, false
}

func TestMQTT5SessionExpiryIsCapped(t *testing.T) {
	h := startHostile(t, hostileOptions{mqtt: broker.MQTTConfig{SessionExpiry: 2 * time.Second}})
	dial := func(expiry uint32) (net.Conn, []byte) {
		c := dialMQTT(t, h)
		_, err := c.Write(connect5("5E:55:00:00:00:07-1", "5E:55:00:00:00:07", gatewaytest.GoodKey, expiry))
		require.NoError(t, err)
		first, body, err := gatewaytest.ReadPacket(c, 10*time.Second)
		require.NoError(t, err)
		require.Equal(t, byte(0x20), first, "CONNACK")
		return c, body
	}

	c, body := dial(0xFFFFFFFF)
	got, ok := connackSessionExpiry(t, body)
	require.True(t, ok, "the CONNACK states the interval in force")
	require.Equal(t, uint32(2), got)
	require.NoError(t, c.Close())
	requireMetric(t, h, "offline_sessions", "", 1)
	requireMetric(t, h, "sessions_expired_total", "expiry", 1)
	requireMetric(t, h, "offline_sessions", "", 0)

	// A DISCONNECT may raise the interval; it is capped too.
	c, body = dial(1)
	_, ok = connackSessionExpiry(t, body)
	require.False(t, ok, "an interval within the cap is the client's")
	disconnect := append([]byte{0, 5, 0x11}, 0xFF, 0xFF, 0xFF, 0xFF)
	_, err := c.Write(gatewaytest.MQTTPacket(0xE0, disconnect))
	require.NoError(t, err)
	requireMetric(t, h, "offline_sessions", "", 1)
	requireMetric(t, h, "sessions_expired_total", "expiry", 2)
	requireMetric(t, h, "offline_sessions", "", 0)

	// An interval of 0 ends the session with the connection.
	c, _ = dial(0)
	require.NoError(t, c.Close())
	time.Sleep(1500 * time.Millisecond) // a sweep
	require.Equal(t, 0.0, sessionMetric(t, h, "offline_sessions", ""))
	require.Equal(t, 2.0, sessionMetric(t, h, "sessions_expired_total", "expiry"))
}

func TestSessionBoundsSettings(t *testing.T) {
	for _, c := range []struct {
		cfg  broker.MQTTConfig
		want string
	}{
		{broker.MQTTConfig{SessionExpiry: -time.Second}, "mqtt.session_expiry: must not be negative"},
		{broker.MQTTConfig{SessionExpiry: 1500 * time.Millisecond}, "mqtt.session_expiry: 1.5s is not a whole number of seconds"},
		{broker.MQTTConfig{SessionExpiry: 1 << 62}, "over MQTT's limit"},
		{broker.MQTTConfig{MaxQueuedPerClient: -1}, "mqtt.max_queued_per_client: must be between 1 and 65000"},
		{broker.MQTTConfig{MaxQueuedPerClient: 70000}, "mqtt.max_queued_per_client"},
		{broker.MQTTConfig{MaxOfflineSessions: -1}, "mqtt.max_offline_sessions: must not be negative"},
		{broker.MQTTConfig{MaxOfflineSessionsPerDevice: -1}, "mqtt.max_offline_sessions_per_device: must not be negative"},
		{broker.MQTTConfig{SessionMemory: 1000}, "mqtt.session_memory: must be at least 1 MiB"},
	} {
		err := c.cfg.Validate()
		require.Error(t, err)
		require.True(t, strings.Contains(err.Error(), c.want), "%v, want %q", err, c.want)
	}
	require.NoError(t, broker.MQTTConfig{SessionExpiry: time.Hour, MaxQueuedPerClient: 65000, SessionMemory: 1 << 20}.Validate())
}

// rawPersistentSession opens an MQTT 3.1.1 session with clean session
// false under clientID, subscribes to hw's ack topic and disconnects.
func rawPersistentSession(t testing.TB, h *gatewaytest.Gateway, clientID, hw string) {
	t.Helper()
	c := dialMQTT(t, h)
	body := append(gatewaytest.MQTTString("MQTT"), 4, 0xC0, 0, 60)
	body = append(body, gatewaytest.MQTTString(clientID)...)
	body = append(body, gatewaytest.MQTTString(hw)...)
	body = append(body, gatewaytest.MQTTString(gatewaytest.GoodKey)...)
	_, err := c.Write(gatewaytest.MQTTPacket(0x10, body))
	require.NoError(t, err)
	first, ack, err := gatewaytest.ReadPacket(c, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, []byte{0x20, 0}, []byte{first, ack[1]}, "CONNACK success")
	_, err = c.Write(gatewaytest.MQTTPacket(0x82, append(append([]byte{0, 1}, gatewaytest.MQTTString(contract.AckTopic(hw))...), 1)))
	require.NoError(t, err)
	first, _, err = gatewaytest.ReadPacket(c, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, byte(0x90), first, "SUBACK")
	_, err = c.Write([]byte{0xE0, 0})
	require.NoError(t, err)
	require.NoError(t, c.Close())
}

// TestOfflineSessionOverhead measures the heap an offline session and a
// queued ack hold and compares it with what the accounting charges.
func TestOfflineSessionOverhead(t *testing.T) {
	const sessions, batches = 300, 10
	const hw = "5E:55:00:00:00:08"
	h, b := startHostileBroker(t, hostileOptions{mqtt: broker.MQTTConfig{MaxOfflineSessionsPerDevice: sessions}})
	sendBatches(t, h, hw, 1) // the device's first batch registers it
	before := heapInUse()
	for i := range sessions {
		rawPersistentSession(t, h, fmt.Sprintf("%s-%d", hw, i), hw)
	}
	requireMetric(t, h, "offline_sessions", "", sessions)
	perSession := (heapInUse() - before) / sessions
	ids := sendBatches(t, h, hw, batches)
	requireMetric(t, h, "queued_messages", "", sessions*batches)
	afterMessages := heapInUse()
	perMessage := (afterMessages - before - perSession*sessions) / (sessions * batches)
	charged := broker.QueuedMessageBytes(contract.AckTopic(hw), contract.EncodeAck(contract.Ack{
		Type: contract.AckTypeReadings, BatchID: ids[0], Status: contract.StatusAccepted}))
	t.Logf("offline session: %d bytes on the heap, %d charged; queued ack: %d bytes on the heap, %d charged",
		perSession, broker.OfflineSessionBytes(b), perMessage, charged)
	// The charge is an upper bound, and not a loose one.
	require.LessOrEqual(t, perSession, broker.OfflineSessionBytes(b))
	require.LessOrEqual(t, perMessage, charged)
	require.Less(t, broker.OfflineSessionBytes(b), 2*perSession)
	require.Less(t, charged, 2*perMessage)
}

// leaveRaw is rawPersistentSession returning its error, for goroutines.
func leaveRaw(addr, clientID, hw string) error {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	body := append(gatewaytest.MQTTString("MQTT"), 4, 0xC0, 0, 60)
	body = append(append(append(body, gatewaytest.MQTTString(clientID)...), gatewaytest.MQTTString(hw)...), gatewaytest.MQTTString(gatewaytest.GoodKey)...)
	subscribe := append(append([]byte{0, 1}, gatewaytest.MQTTString(contract.AckTopic(hw))...), 1)
	for _, p := range [][]byte{gatewaytest.MQTTPacket(0x10, body), gatewaytest.MQTTPacket(0x82, subscribe)} {
		if _, err := c.Write(p); err != nil {
			return err
		}
		if _, _, err := gatewaytest.ReadPacket(c, 10*time.Second); err != nil {
			return err
		}
	}
	_, err = c.Write([]byte{0xE0, 0})
	return err
}

func TestSessionCountsExactUnderConcurrency(t *testing.T) {
	const hw, sessions, cap, batches = "5E:55:00:00:00:09", 40, 4, 30
	h := startHostile(t, hostileOptions{mqtt: broker.MQTTConfig{MaxOfflineSessionsPerDevice: cap, MaxQueuedPerClient: 10,
		// All connect at once: the connected-slot cap is not under test.
		MaxSessionsPerDevice: sessions}})
	addr := strings.TrimPrefix(h.MQTTAddr, "tcp://")
	var wg sync.WaitGroup
	errs := make(chan error, sessions)
	for i := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- leaveRaw(addr, fmt.Sprintf("%s-%d", hw, i), hw)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	requireMetric(t, h, "offline_sessions", "", cap)
	requireMetric(t, h, "sessions_expired_total", "device_cap", sessions-cap)

	// Acks published from two connections at once, to the sessions left.
	wg.Add(2)
	for _, id := range []string{hw, hw + "-pub"} {
		go func() {
			defer wg.Done()
			c := paho.NewClient(paho.NewClientOptions().AddBroker(h.MQTTAddr).SetClientID(id).SetUsername(hw).
				SetPassword(gatewaytest.GoodKey).SetAutoReconnect(false))
			if tok := c.Connect(); !tok.WaitTimeout(20*time.Second) || tok.Error() != nil {
				t.Errorf("connect %s: %v", id, tok.Error())
				return
			}
			defer c.Disconnect(50)
			boot := gatewaytest.NewBoot()
			for i := range batches {
				if tok := c.Publish(contract.ReadingsTopic(hw), 1, false, gatewaytest.BatchJSON(hw, boot, i, 1)); !tok.WaitTimeout(20 * time.Second) {
					t.Errorf("%s: no PUBACK", id)
					return
				}
			}
		}()
	}
	wg.Wait()
	requireMetric(t, h, "queued_messages", "", cap*10)
	require.Equal(t, float64(cap*(2*batches-10)), sessionMetric(t, h, "messages_shed_total", "client_cap"))

	// Each session ends (a clean session takes it over): nothing is left.
	for i := range sessions {
		d := paho.NewClient(paho.NewClientOptions().AddBroker(h.MQTTAddr).SetClientID(fmt.Sprintf("%s-%d", hw, i)).
			SetUsername(hw).SetPassword(gatewaytest.GoodKey).SetCleanSession(true).SetAutoReconnect(false))
		tok := d.Connect()
		require.True(t, tok.WaitTimeout(20*time.Second))
		require.NoError(t, tok.Error())
		d.Disconnect(50)
	}
	for _, name := range []string{"offline_sessions", "queued_messages", "queued_bytes", "session_state_bytes"} {
		requireMetric(t, h, name, "", 0)
	}
}
