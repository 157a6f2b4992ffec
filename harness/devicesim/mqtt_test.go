package devicesim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/syncbuf"
)

// ackingHook makes an in-process mochi broker answer like the gateway: it authenticates devices
// by hardware_id and API key, confines them to their own topics, acks registrations, answers
// the first batch of each device with buffer_full and stores the rest.
type ackingHook struct {
	mochi.HookBase
	t      testing.TB
	apiKey string
	server *mochi.Server

	mu          sync.Mutex
	full        map[string]bool     // hardware_id -> got its buffer_full
	stored      map[string]bool     // batch_id
	registry    map[string]string   // hardware_id -> boot_id
	boots       map[string][]string // hardware_id -> boot_id of every registration
	readingsQoS map[byte]int        // QoS of readings publishes -> count
	unclean     map[string]int      // client id -> connections lost without a DISCONNECT
	clean       map[string]int      // client id -> clean disconnects

	// With enroll, the hook enrolls like the gateway in auth.device_keys preferred: a
	// registration over a fleet-key connection of a device without a device key is answered
	// with one, which the device then uses as password; a fleet key is refused for a device
	// that has used its device key.
	enroll     bool
	deviceKeys map[string]string   // hardware_id -> device key issued
	bound      map[string]bool     // hardware_id -> connected with its device key
	fleetConn  map[string]bool     // client id -> its current connection uses the fleet key
	connKeys   map[string][]string // client id -> "fleet" or "device" for every accepted connection
}

func (h *ackingHook) ID() string { return "acking" }

func (h *ackingHook) Provides(b byte) bool {
	return bytes.Contains([]byte{mochi.OnConnectAuthenticate, mochi.OnACLCheck, mochi.OnPublished,
		mochi.OnDisconnect}, []byte{b})
}

func (h *ackingHook) OnDisconnect(cl *mochi.Client, err error, _ bool) {
	if cl.Net.Inline {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil || errors.Is(err, packets.CodeDisconnect) {
		h.clean[cl.ID]++
	} else {
		h.unclean[cl.ID]++
	}
}

func (h *ackingHook) OnConnectAuthenticate(cl *mochi.Client, pk packets.Packet) bool {
	if string(pk.Connect.Username) != cl.ID {
		return false
	}
	password := string(pk.Connect.Password)
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case !h.enroll:
		return password == h.apiKey
	case password == h.apiKey && !h.bound[cl.ID]:
		h.fleetConn[cl.ID] = true
		h.connKeys[cl.ID] = append(h.connKeys[cl.ID], "fleet")
		return true
	case password != "" && password == h.deviceKeys[cl.ID]:
		h.fleetConn[cl.ID], h.bound[cl.ID] = false, true
		h.connKeys[cl.ID] = append(h.connKeys[cl.ID], "device")
		return true
	}
	return false
}

func (h *ackingHook) OnACLCheck(cl *mochi.Client, topic string, write bool) bool {
	if cl.Net.Inline {
		return true
	}
	if write {
		return strings.HasPrefix(topic, "devices/"+cl.ID+"/")
	}
	return topic == contract.AckTopic(cl.ID)
}

func (h *ackingHook) OnPublished(cl *mochi.Client, pk packets.Packet) {
	if cl.Net.Inline {
		return
	}
	hw, kind, ok := contract.ParseTopic(pk.TopicName)
	if !ok {
		h.t.Errorf("publish on %s", pk.TopicName)
		return
	}
	var ack contract.Ack
	h.mu.Lock()
	switch kind {
	case contract.KindRegister:
		reg, err := contract.DecodeRegistration(pk.Payload, hw)
		if err == nil {
			h.registry[hw] = reg.BootID
			h.boots[hw] = append(h.boots[hw], reg.BootID)
		}
		ack = contract.RegisterAck("550e8400-e29b-41d4-a716-446655440000", err)
		if err == nil && h.enroll && h.fleetConn[hw] && h.deviceKeys[hw] == "" {
			ack.DeviceKey, ack.DeviceKeyID = mintDeviceKey(h.t)
			h.deviceKeys[hw] = ack.DeviceKey
		}
	case contract.KindReadings:
		h.readingsQoS[pk.FixedHeader.Qos]++
		b, err := contract.DecodeBatch(pk.Payload, hw, contract.Limits{}, time.Now())
		switch {
		case err != nil:
			ack = contract.ReadingsAck("", "", err)
		case !h.full[hw]:
			h.full[hw] = true
			ack = contract.ReadingsAck(b.BatchID, "", contract.NewError(contract.ReasonBufferFull, "", "buffer full"))
		case h.stored[b.BatchID]:
			ack = contract.ReadingsAck(b.BatchID, contract.StatusDuplicate, nil)
		default:
			h.stored[b.BatchID] = true
			ack = contract.ReadingsAck(b.BatchID, contract.StatusAccepted, nil)
		}
	}
	server := h.server
	h.mu.Unlock()
	payload, err := json.Marshal(ack)
	if err != nil {
		h.t.Errorf("encoding ack: %v", err)
		return
	}
	if err := server.Publish(contract.AckTopic(hw), payload, false, 1); err != nil {
		h.t.Errorf("publishing ack: %v", err)
	}
}

func startBroker(t *testing.T, apiKey string) (func(), *ackingHook, string) {
	t.Helper()
	hook := &ackingHook{t: t, apiKey: apiKey,
		full: map[string]bool{}, stored: map[string]bool{}, registry: map[string]string{},
		boots: map[string][]string{}, readingsQoS: map[byte]int{},
		unclean: map[string]int{}, clean: map[string]int{},
		deviceKeys: map[string]string{}, bound: map[string]bool{}, fleetConn: map[string]bool{}, connKeys: map[string][]string{}}
	closeServer, addr := startBrokerAt(t, hook, "127.0.0.1:0")
	return closeServer, hook, "tcp://" + addr
}

// startBrokerAt starts a broker on addr whose answers come from hook. Its close function is
// idempotent (mochi's Close is not).
func startBrokerAt(t *testing.T, hook *ackingHook, addr string) (func(), string) {
	t.Helper()
	server := mochi.New(&mochi.Options{InlineClient: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	hook.mu.Lock()
	hook.server = server
	hook.mu.Unlock()
	require.NoError(t, server.AddHook(hook, nil))
	tcp := listeners.NewTCP(listeners.Config{ID: "tcp", Address: addr})
	require.NoError(t, server.AddListener(tcp))
	require.NoError(t, server.Serve())
	closeServer := sync.OnceFunc(func() { _ = server.Close() })
	t.Cleanup(closeServer)
	return closeServer, tcp.Address()
}

// TestMQTTModeAgainstBroker is a smoke test of the MQTT link: credentials, ack subscription
// before the first publish, acks matched by batch_id, buffer_full retried. The gateway's own
// integration tests run the simulator against the real ingest path.
func TestMQTTModeAgainstBroker(t *testing.T) {
	_, hook, url := startBroker(t, "secret")

	cfg := fastConfig(50*time.Millisecond, 50*time.Millisecond, 10*time.Second)
	cfg.MQTTURL = url
	cfg.APIKey = "secret"
	cfg.Devices = 2
	cfg.FirstMAC = "02:00:00:00:00:ff"
	cfg.Batches = 3

	sim, lines := runWithReport(t, cfg)
	require.Len(t, lines, 6)

	hook.mu.Lock()
	defer hook.mu.Unlock()
	require.Len(t, hook.stored, 6)
	require.Len(t, hook.registry, 2)
	for _, l := range lines {
		require.Equal(t, "accepted", l.Status)
		require.True(t, hook.stored[l.BatchID])
		require.Equal(t, hook.registry[l.HardwareID], l.BootID)
	}
	for _, st := range sim.Stats() {
		require.Contains(t, []string{"02:00:00:00:00:FF", "02:00:00:00:01:00"}, st.HardwareID)
		require.True(t, st.Registered)
		require.Equal(t, 3, st.Accepted)
		require.Equal(t, map[string]int{"buffer_full": 1}, st.Retried, "no ack was missed")
	}
}

func TestMQTTModeRefusedKey(t *testing.T) {
	_, _, url := startBroker(t, "secret")
	cfg := fastConfig(20*time.Millisecond, 50*time.Millisecond, 300*time.Millisecond)
	cfg.MQTTURL = url
	cfg.APIKey = "wrong"
	cfg.Devices = 1
	cfg.Batches = 2
	sim, err := New(cfg, testLogger(t))
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, sim.Run(t.Context()))
	require.Less(t, time.Since(start), 5*time.Second, "stops within its drain timeout")
	st := sim.Stats()[0]
	require.Equal(t, 2, st.Pending)
	require.Zero(t, st.Sent)
}

// TestMQTTModeReconnects restarts the broker under a running device: the device resubscribes,
// registers again and re-sends what was not confirmed.
func TestMQTTModeReconnects(t *testing.T) {
	first, hook, url := startBroker(t, "secret")
	hook.mu.Lock()
	hook.full["02:00:00:00:00:01"] = true // no buffer_full in this test
	hook.mu.Unlock()

	cfg := fastConfig(50*time.Millisecond, 100*time.Millisecond, 20*time.Second)
	cfg.MQTTURL = url
	cfg.APIKey = "secret"
	cfg.Devices = 1
	cfg.Batches = 40
	cfg.AckTimeout = 2 * time.Second
	sim, err := New(cfg, testLogger(t))
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() { done <- sim.Run(t.Context()) }()
	time.Sleep(500 * time.Millisecond)
	first()
	time.Sleep(300 * time.Millisecond)
	startBrokerAt(t, hook, strings.TrimPrefix(url, "tcp://"))

	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the simulator did not stop")
	}
	st := sim.Stats()[0]
	require.Equal(t, 40, st.Accepted+st.Duplicates, "every batch confirmed across the restart")
	require.Zero(t, st.Pending)
	hook.mu.Lock()
	defer hook.mu.Unlock()
	require.Len(t, hook.stored, 40)
}

// TestMQTTModeReboots: a rebooting device drops its connection without a DISCONNECT, comes
// back with a new boot_id, registers on devices/{hw}/register again and keeps its buffer.
func TestMQTTModeReboots(t *testing.T) {
	_, hook, url := startBroker(t, "secret")

	cfg := fastConfig(50*time.Millisecond, 50*time.Millisecond, 10*time.Second)
	cfg.MQTTURL = url
	cfg.APIKey = "secret"
	cfg.Devices = 2
	cfg.Duration = 1500 * time.Millisecond
	cfg.RebootEvery = 400 * time.Millisecond
	cfg.Reboots = 2

	sim, lines := runWithReport(t, cfg)

	hook.mu.Lock()
	defer hook.mu.Unlock()
	total := 0
	for _, st := range sim.Stats() {
		hw := st.HardwareID
		require.Equal(t, 2, st.Reboots)
		boots := hook.boots[hw]
		require.Len(t, boots, 3, "a registration per boot")
		require.NotEqual(t, boots[0], boots[1])
		require.NotEqual(t, boots[1], boots[2])
		require.Equal(t, boots[2], st.BootID)
		// The last boot's registration is always confirmed (a device waits
		// for it before it stops); an earlier one may be cut by the reboot
		// before its answer arrives, on a loaded machine.
		require.GreaterOrEqual(t, st.Registrations, 1)
		require.LessOrEqual(t, st.Registrations, 3)
		require.Equal(t, "550e8400-e29b-41d4-a716-446655440000", st.ConfirmationID)
		require.Equal(t, 2, hook.unclean[hw], "each reboot cut the connection without a DISCONNECT")
		require.Zero(t, st.Pending)
		require.Equal(t, st.Built, st.Accepted+st.Duplicates)
		total += st.Built
	}
	require.Len(t, lines, total)
	require.Len(t, hook.stored, total)
	for _, l := range lines {
		require.True(t, hook.stored[l.BatchID])
		require.Contains(t, hook.boots[l.HardwareID], l.BootID)
	}
}

// TestMQTTModeQoS0: at QoS 0 there is no PUBACK; the device frees its batches on the ack topic
// only, matched by batch_id.
func TestMQTTModeQoS0(t *testing.T) {
	_, hook, url := startBroker(t, "secret")

	cfg := fastConfig(50*time.Millisecond, 50*time.Millisecond, 10*time.Second)
	cfg.MQTTURL = url
	cfg.APIKey = "secret"
	cfg.Devices = 2
	cfg.QoS = 0
	cfg.Batches = 3
	cfg.MaxInflight = 3

	sim := runToEnd(t, cfg)

	hook.mu.Lock()
	defer hook.mu.Unlock()
	require.Len(t, hook.stored, 6)
	require.Equal(t, map[byte]int{0: 8}, hook.readingsQoS, "6 batches and 2 buffer_full retries, all at QoS 0")
	for _, st := range sim.Stats() {
		require.True(t, st.Registered)
		require.Equal(t, 3, st.Accepted)
		require.Zero(t, st.Pending)
		require.Equal(t, map[string]int{"buffer_full": 1}, st.Retried, "no ack was missed")
	}
}

// TestMQTTModeEnrolls: a device registering with the fleet key is answered its device key on
// the ack topic, stores it and reconnects with it as password; its readings go with it.
func TestMQTTModeEnrolls(t *testing.T) {
	_, hook, url := startBroker(t, "fleet")
	hook.mu.Lock()
	hook.enroll = true
	hook.mu.Unlock()

	cfg := fastConfig(50*time.Millisecond, 50*time.Millisecond, 10*time.Second)
	cfg.MQTTURL = url
	cfg.APIKey = "fleet"
	cfg.Devices = 2
	cfg.Batches = 3
	cfg.KeyStorePath = filepath.Join(t.TempDir(), "keys.json")

	sim := runToEnd(t, cfg)
	// The broker sees the last session's DISCONNECT on its own goroutine,
	// possibly after Run returned.
	require.Eventually(t, func() bool {
		hook.mu.Lock()
		defer hook.mu.Unlock()
		for _, st := range sim.Stats() {
			if hook.clean[st.HardwareID] < 2 {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "both sessions of each device closed cleanly")

	hook.mu.Lock()
	defer hook.mu.Unlock()
	require.Len(t, hook.stored, 6)
	stored := readKeyStore(t, cfg.KeyStorePath)
	require.Equal(t, hook.deviceKeys, stored, "every key issued is in the key store")
	for _, st := range sim.Stats() {
		hw := st.HardwareID
		require.Equal(t, 3, st.Accepted)
		require.Equal(t, keyEnrolled, st.Key)
		require.Equal(t, []string{"fleet", "device"}, hook.connKeys[hw], "enrolled once, then reconnected with the device key")
		require.Equal(t, 2, hook.clean[hw], "the fleet-key session and the last one were closed cleanly")
		require.Zero(t, hook.unclean[hw])
		require.Len(t, hook.boots[hw], 2, "registered again with the device key")
	}
}

// TestMQTTModeFleetKeyRefusedAfterBinding: a device that lost its device key (a simulator
// restarted without its key store) is refused at CONNACK with the fleet key, keeps its
// batches and retries only every RetryMax.
func TestMQTTModeFleetKeyRefusedAfterBinding(t *testing.T) {
	_, hook, url := startBroker(t, "fleet")
	hook.mu.Lock()
	hook.enroll = true
	hook.deviceKeys["02:00:00:00:00:01"] = testDevKey
	hook.bound["02:00:00:00:00:01"] = true
	hook.mu.Unlock()

	var logs syncbuf.Buffer
	cfg := fastConfig(20*time.Millisecond, 200*time.Millisecond, time.Second)
	cfg.MQTTURL = url
	cfg.APIKey = "fleet"
	cfg.Devices = 1
	cfg.Batches = 2
	sim, err := New(cfg, infoLogger(&logs))
	require.NoError(t, err)
	require.NoError(t, sim.Run(t.Context()))
	st := sim.Stats()[0]
	require.Equal(t, 2, st.Pending, "the batches are kept")
	require.Zero(t, st.Sent)
	out := logs.String()
	require.Equal(t, 1, strings.Count(out, "level=ERROR msg=\"the broker refused the key (CONNACK not authorized)"), out)
	require.Contains(t, out, "gatewayctl devices reset-key")
	require.NotContains(t, out, "level=WARN msg=\"connecting to the broker")
}

// runWithReport is runToEnd with the devices' report written to a temporary file, and
// returns the report too.
func runWithReport(t *testing.T, cfg Config) (*Sim, []ReportLine) {
	t.Helper()
	cfg.ReportPath = filepath.Join(t.TempDir(), "report.jsonl")
	sim := runToEnd(t, cfg)
	return sim, readReportFile(t, cfg.ReportPath)
}

// runToEnd runs a simulator of cfg until it stops by itself (its Batches
// sent, or DrainTimeout), within 30 seconds.
func runToEnd(t *testing.T, cfg Config) *Sim {
	t.Helper()
	sim, err := New(cfg, testLogger(t))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	require.NoError(t, sim.Run(ctx))
	require.NoError(t, ctx.Err(), "the simulator stopped by itself")
	return sim
}
