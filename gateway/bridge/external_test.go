package bridge_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/gateway/bridge"
	"greenhouse-gateway/gateway/ingest"
	"greenhouse-gateway/harness/gatewaytest"
	"greenhouse-gateway/harness/mosquittotest"
)

const hwA = "AA:BB:CC:DD:EE:01"

// The external broker mode against a real mosquitto: devices are played by
// mosquitto_pub, and acks are read with mosquitto_sub, clients independent
// of the gateway's own paho client.

func TestExternalConfigValidate(t *testing.T) {
	tests := []struct {
		name  string
		cfg   bridge.ExternalConfig
		field string // "" when valid
	}{
		{"minimal", bridge.ExternalConfig{URL: "tcp://broker.lan:1883"}, ""},
		{"tls", bridge.ExternalConfig{URL: "ssl://broker.lan:8883", Username: "gw", Password: "pw"}, ""},
		{"all set", bridge.ExternalConfig{URL: "mqtts://10.0.0.1:8883", ClientID: "gw-2", SharedGroup: "gateways",
			QoS: 2, ConnectTimeout: time.Second, AckTimeout: time.Second}, ""},
		{"no url", bridge.ExternalConfig{}, "mqtt.external.url"},
		{"no port", bridge.ExternalConfig{URL: "tcp://broker.lan"}, "mqtt.external.url"},
		{"websocket", bridge.ExternalConfig{URL: "ws://broker.lan:80"}, "mqtt.external.url"},
		{"credentials in url", bridge.ExternalConfig{URL: "tcp://u:p@broker.lan:1883"}, "mqtt.external.url"},
		{"a path", bridge.ExternalConfig{URL: "tcp://broker.lan:1883/devices"}, "mqtt.external.url"},
		{"password alone", bridge.ExternalConfig{URL: "tcp://b:1883", Password: "pw"}, "mqtt.external.password"},
		{"group with slash", bridge.ExternalConfig{URL: "tcp://b:1883", SharedGroup: "a/b"}, "mqtt.external.shared_group"},
		{"group with wildcard", bridge.ExternalConfig{URL: "tcp://b:1883", SharedGroup: "a+"}, "mqtt.external.shared_group"},
		{"qos 3", bridge.ExternalConfig{URL: "tcp://b:1883", QoS: 3}, "mqtt.external.qos"},
		{"negative qos", bridge.ExternalConfig{URL: "tcp://b:1883", QoS: -1}, "mqtt.external.qos"},
		{"negative connect timeout", bridge.ExternalConfig{URL: "tcp://b:1883", ConnectTimeout: -1}, "mqtt.external.connect_timeout"},
		{"negative ack timeout", bridge.ExternalConfig{URL: "tcp://b:1883", AckTimeout: -1}, "mqtt.external.ack_timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			_, newErr := bridge.NewExternal(tt.cfg, &ingest.Ingest{}, nil, nil)
			if tt.field == "" {
				require.NoError(t, err)
				require.NoError(t, newErr)
				return
			}
			require.Error(t, err)
			require.True(t, strings.HasPrefix(err.Error(), tt.field+":"), "%q names %s", err, tt.field)
			require.Equal(t, err, newErr, "NewExternal validates")
		})
	}
	d := bridge.DefaultExternalConfig()
	require.Equal(t, "greenhouse-gateway", d.ClientID)
	require.Equal(t, 1, d.QoS)
	require.Positive(t, d.ConnectTimeout)
	require.Positive(t, d.AckTimeout)
}

func TestExternalAcceptedBatchIsStoredAndAcked(t *testing.T) {
	for _, qos := range []int{1, 2} {
		t.Run(fmt.Sprintf("qos %d", qos), func(t *testing.T) {
			mq := startMosquitto(t)
			buf := openBuffer(t)
			cfg := bridge.ExternalConfig{URL: mq.URL(), ClientID: "gw-accept", QoS: qos}
			gw := runExternal(t, cfg, newExternalIngest(t, buf))
			acks := subscribeAcks(t, mq)

			payload := gatewaytest.BatchJSON(hwA, gatewaytest.NewBoot(), 0, 3)
			id := gatewaytest.BatchIDOf(t, payload)
			require.NoError(t, mosquittotest.Pub(t, mq.URL(), contract.ReadingsTopic(hwA), qos, payload, hwA, gatewaytest.GoodKey))
			a := acks.next(t, hwA)
			require.Equal(t, contract.Ack{Type: contract.AckTypeReadings, BatchID: id, Status: contract.StatusAccepted}, a)
			state, err := buf.Lookup(id)
			require.NoError(t, err)
			require.Equal(t, "pending", state, "accepted means stored")

			// The same batch again, with other bytes: a duplicate, stored once.
			require.NoError(t, mosquittotest.Pub(t, mq.URL(), contract.ReadingsTopic(hwA), qos, gatewaytest.Reorder(t, payload), "", ""))
			require.Equal(t, contract.StatusDuplicate, acks.next(t, hwA).Status)
			require.EqualValues(t, 1, buf.Stats().PendingBatches)
			gatewaytest.WaitFor(t, 5*time.Second, "both counted", func() bool { return gw.metric(t, "acked") == 2 })
			require.Equal(t, 1.0, gw.connected(t))

			// Both were acknowledged (PUBACK, or PUBREC at QoS 2) after all.
			gw.stop(t)
			runExternal(t, cfg, newExternalIngest(t, buf))
			assertNothingRedelivered(t, mq, acks)
		})
	}
}

func TestExternalInvalidPayloadIsRejectedAndAcked(t *testing.T) {
	mq := startMosquitto(t)
	buf := openBuffer(t)
	ing := newExternalIngest(t, buf)
	cfg := bridge.ExternalConfig{URL: mq.URL(), ClientID: "gw-invalid"}
	gw := runExternal(t, cfg, ing)
	acks := subscribeAcks(t, mq)

	require.NoError(t, mosquittotest.Pub(t, mq.URL(), contract.ReadingsTopic(hwA), 1, []byte(`{"batch_id":`), "", ""))
	a := acks.next(t, hwA)
	require.Equal(t, contract.StatusRejected, a.Status)
	require.NotNil(t, a.Reason)
	require.Equal(t, contract.ReasonValidation, *a.Reason)
	require.NotNil(t, a.Message)
	require.Contains(t, *a.Message, "JSON")

	// A topic under the subscription that is no device's (hardware_id in
	// lower case) is acknowledged unread.
	require.NoError(t, mosquittotest.Pub(t, mq.URL(), "devices/aa:bb:cc:dd:ee:01/readings", 1, []byte(`{}`), "", ""))
	gatewaytest.WaitFor(t, 10*time.Second, "the foreign message counted", func() bool {
		return gw.metric(t, "ignored") == 1
	})
	require.Equal(t, 1.0, gw.metric(t, "acked"))
	require.Equal(t, 0.0, gw.metric(t, "withheld"))

	// Both were acknowledged at the MQTT level: a new gateway process with
	// the same session gets neither again, and the next ack is for a new
	// batch.
	gw.stop(t)
	runExternal(t, cfg, ing)
	assertNothingRedelivered(t, mq, acks)
	require.EqualValues(t, 1, buf.Stats().PendingBatches)
}

func TestExternalRestartLosesNothingTheBrokerHeld(t *testing.T) {
	mq := startMosquitto(t)
	buf := openBuffer(t)
	cfg := bridge.ExternalConfig{URL: mq.URL(), ClientID: "gw-restart"}
	// The first run creates the session and its subscriptions.
	first := runExternal(t, cfg, newExternalIngest(t, buf))
	first.stop(t)

	acks := subscribeAcks(t, mq)
	devices := []string{hwA, "AA:BB:CC:DD:EE:02", "AA:BB:CC:DD:EE:03"}
	// 30 messages: more than mosquitto's in-flight window of 20.
	const perDevice = 10
	want := map[string][]string{} // batch IDs per device, in publish order
	for i := range perDevice {
		for _, hw := range devices {
			payload := gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), i, 2)
			want[hw] = append(want[hw], gatewaytest.BatchIDOf(t, payload))
			require.NoError(t, mosquittotest.Pub(t, mq.URL(), contract.ReadingsTopic(hw), 1, payload, "", ""))
		}
	}

	// A new process over the same buffer, with the same client ID.
	second := runExternal(t, cfg, newExternalIngest(t, buf))
	got := map[string][]string{}
	for range len(devices) * perDevice {
		a := acks.next(t, "")
		require.Equal(t, contract.StatusAccepted, a.Status, "%+v", a)
		hw := a.BatchID[:len(hwA)]
		got[hw] = append(got[hw], a.BatchID)
	}
	require.Equal(t, want, got, "every batch accepted once, each device's in order")
	for _, ids := range want {
		for _, id := range ids {
			state, err := buf.Lookup(id)
			require.NoError(t, err)
			require.Equal(t, "pending", state)
		}
	}
	require.EqualValues(t, len(devices)*perDevice, buf.Stats().PendingBatches, "stored exactly once")
	gatewaytest.WaitFor(t, 5*time.Second, "all counted", func() bool { return second.metric(t, "acked") == float64(len(devices)*perDevice) })

	// And every one was acknowledged: the broker holds none of them any more.
	second.stop(t)
	runExternal(t, cfg, newExternalIngest(t, buf))
	assertNothingRedelivered(t, mq, acks)
}

func TestExternalCommitFailureIsRedelivered(t *testing.T) {
	mq := startMosquitto(t)
	buf := openBuffer(t)
	store := &switchStore{buf: buf}
	store.setFailing(true)
	gw := runExternal(t, bridge.ExternalConfig{URL: mq.URL(), ClientID: "gw-failing"}, newExternalIngest(t, store))
	acks := subscribeAcks(t, mq)

	payload := gatewaytest.BatchJSON(hwA, gatewaytest.NewBoot(), 0, 2)
	id := gatewaytest.BatchIDOf(t, payload)
	require.NoError(t, mosquittotest.Pub(t, mq.URL(), contract.ReadingsTopic(hwA), 1, payload, "", ""))
	a := acks.next(t, hwA)
	require.Equal(t, contract.StatusRejected, a.Status)
	require.Equal(t, contract.ReasonBufferFull, *a.Reason, "the device is told to keep it")
	require.Equal(t, id, a.BatchID)

	// Not acknowledged, so the broker delivers it again after the gateway's
	// reconnect; still failing, and again.
	gatewaytest.WaitFor(t, 10*time.Second, "two redeliveries", func() bool { return gw.metric(t, "withheld") >= 3 })
	require.GreaterOrEqual(t, store.attempts(), 3)
	store.setFailing(false)
	for {
		a = acks.next(t, hwA)
		if a.Status != contract.StatusRejected {
			break
		}
		require.Equal(t, contract.ReasonBufferFull, *a.Reason)
	}
	require.Equal(t, contract.StatusAccepted, a.Status, "stored at the first redelivery after the disk recovered")
	state, err := buf.Lookup(id)
	require.NoError(t, err)
	require.Equal(t, "pending", state)
	require.EqualValues(t, 1, buf.Stats().PendingBatches)
	gatewaytest.WaitFor(t, 5*time.Second, "the ack counted", func() bool { return gw.metric(t, "acked") == 1 })
	require.Equal(t, 1.0, gw.connected(t), "connected again")
}

func TestExternalSharedSubscriptionStoresEachBatchOnce(t *testing.T) {
	mq := startMosquitto(t)
	bufs := []*buffer.Buffer{openBuffer(t), openBuffer(t)}
	var gws []*externalRun
	for i, buf := range bufs {
		gws = append(gws, runExternal(t, bridge.ExternalConfig{URL: mq.URL(), ClientID: fmt.Sprintf("gw-shared-%d", i),
			SharedGroup: "gateways"}, newExternalIngest(t, buf)))
	}
	acks := subscribeAcks(t, mq)

	const n = 12
	var ids []string
	for i := range n {
		hw := fmt.Sprintf("AA:BB:CC:DD:EE:%02d", i%3+1)
		payload := gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), i, 1)
		ids = append(ids, gatewaytest.BatchIDOf(t, payload))
		require.NoError(t, mosquittotest.Pub(t, mq.URL(), contract.ReadingsTopic(hw), 1, payload, "", ""))
	}
	for range n {
		require.Equal(t, contract.StatusAccepted, acks.next(t, "").Status)
	}
	for _, id := range ids {
		var in []int
		for i, buf := range bufs {
			if state, err := buf.Lookup(id); err == nil && state == "pending" {
				in = append(in, i)
			}
		}
		require.Len(t, in, 1, "batch %s stored by exactly one gateway", id)
	}
	require.EqualValues(t, n, bufs[0].Stats().PendingBatches+bufs[1].Stats().PendingBatches)
	for i, gw := range gws {
		require.Positive(t, gw.metric(t, "acked"), "gateway %d took part", i)
	}
	assertNoAck(t, acks, 300*time.Millisecond)
}

func TestExternalReconnectsAfterBrokerRestart(t *testing.T) {
	mq := startMosquitto(t)
	buf := openBuffer(t)
	gw := runExternal(t, bridge.ExternalConfig{URL: mq.URL(), ClientID: "gw-broker-restart"}, newExternalIngest(t, buf))
	mq.Stop(t)
	gatewaytest.WaitFor(t, 10*time.Second, "the loss noticed", func() bool { return !gw.ext.Connected() })
	require.Equal(t, 0.0, gw.connected(t))
	// Published while the gateway is away: the broker's persistent session
	// holds it for the gateway.
	mq.Restart(t)
	payload := gatewaytest.BatchJSON(hwA, gatewaytest.NewBoot(), 0, 1)
	require.NoError(t, mosquittotest.Pub(t, mq.URL(), contract.ReadingsTopic(hwA), 1, payload, "", ""))
	gatewaytest.WaitFor(t, 10*time.Second, "reconnected and stored", func() bool {
		state, err := buf.Lookup(gatewaytest.BatchIDOf(t, payload))
		return err == nil && state == "pending"
	})
	gatewaytest.WaitFor(t, 5*time.Second, "connected", gw.ext.Connected)
}

// ---- helpers ----

func startMosquitto(t *testing.T) *mosquittotest.Broker {
	t.Helper()
	if testing.Short() {
		t.Skip("starts mosquitto")
	}
	return mosquittotest.Start(t)
}

func openBuffer(t *testing.T) *buffer.Buffer {
	t.Helper()
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, buf.Close()) })
	return buf
}

// newExternalIngest returns an ingest path over store without a device
// registry: the external broker authenticates devices, and registrations
// are not what these tests are about.
func newExternalIngest(t *testing.T, store ingest.Committer) *ingest.Ingest {
	t.Helper()
	ing, err := ingest.New(ingest.Config{}, ingest.Deps{Store: store, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	return ing
}

// externalRun is one External running in the background, like one gateway
// process.
type externalRun struct {
	ext  *bridge.External
	reg  *prometheus.Registry
	stop func(t *testing.T)
}

// metric returns gateway_mqtt_external_messages_total{result}.
func (r *externalRun) metric(t *testing.T, result string) float64 {
	t.Helper()
	return gatewaytest.GatherValue(t, r.reg, "gateway_mqtt_external_messages_total", "result", result)
}

// connected returns gateway_mqtt_external_connected.
func (r *externalRun) connected(t *testing.T) float64 {
	t.Helper()
	return gatewaytest.GatherValue(t, r.reg, "gateway_mqtt_external_connected", "", "")
}

// runExternal starts cfg's External over ingest and waits until it is
// connected and subscribed. It is stopped at the test's cleanup, if not
// before.
func runExternal(t *testing.T, cfg bridge.ExternalConfig, ing *ingest.Ingest) *externalRun {
	t.Helper()
	reg := prometheus.NewRegistry()
	logger := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = 5 * time.Second
	}
	ext, err := bridge.NewExternal(cfg, ing, logger, reg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ext.Run(ctx) }()
	var once sync.Once
	r := &externalRun{ext: ext, reg: reg}
	r.stop = func(t *testing.T) {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(20 * time.Second):
				t.Error("External.Run did not return within 20s of its context's end")
			}
		})
	}
	t.Cleanup(func() { r.stop(t) })
	gatewaytest.WaitFor(t, 10*time.Second, "connected to mosquitto", ext.Connected)
	return r
}

// ackStream reads the gateway's acks with mosquitto_sub.
type ackStream struct{ sub *mosquittotest.Subscription }

func subscribeAcks(t *testing.T, mq *mosquittotest.Broker) *ackStream {
	t.Helper()
	sub, err := mosquittotest.Sub(t, mq.URL(), contract.TopicPrefix+"+/"+contract.KindAck, 1, "", "")
	require.NoError(t, err)
	return &ackStream{sub: sub}
}

// next returns the next ack, checking that it went to hw's ack topic (any
// device's when hw is "", but then the one its batch_id names).
func (s *ackStream) next(t *testing.T, hw string) contract.Ack {
	t.Helper()
	m, err := s.sub.Next(15 * time.Second)
	require.NoError(t, err, "waiting for an ack")
	var a contract.Ack
	require.NoError(t, json.Unmarshal(m.Payload, &a), "ack %s", m.Payload)
	if hw == "" && len(a.BatchID) > len(hwA) {
		hw = a.BatchID[:len(hwA)]
	}
	require.Equal(t, contract.AckTopic(hw), m.Topic, "ack %s", m.Payload)
	return a
}

func assertNoAck(t *testing.T, s *ackStream, wait time.Duration) {
	t.Helper()
	if m, err := s.sub.Next(wait); err == nil {
		t.Fatalf("unexpected ack on %s: %s", m.Topic, m.Payload)
	}
}

// assertNothingRedelivered publishes a new batch to a freshly connected
// gateway: a message the broker still held would be delivered before it,
// so its ack must come first.
func assertNothingRedelivered(t *testing.T, mq *mosquittotest.Broker, acks *ackStream) {
	t.Helper()
	marker := gatewaytest.BatchJSON(hwA, gatewaytest.NewBoot(), 99, 1)
	require.NoError(t, mosquittotest.Pub(t, mq.URL(), contract.ReadingsTopic(hwA), 1, marker, "", ""))
	a := acks.next(t, hwA)
	require.Equal(t, gatewaytest.BatchIDOf(t, marker), a.BatchID, "the first ack after the restart is for the new batch: %+v", a)
	require.Equal(t, contract.StatusAccepted, a.Status)
}

// switchStore commits to the buffer, or fails every commit while failing.
type switchStore struct {
	buf *buffer.Buffer

	mu    sync.Mutex
	fail  bool
	tries int
}

func (s *switchStore) Commit(ctx context.Context, entries []buffer.Entry) ([]buffer.Outcome, error) {
	s.mu.Lock()
	s.tries++
	fail := s.fail
	s.mu.Unlock()
	if fail {
		return nil, errors.New("injected: input/output error")
	}
	return s.buf.Commit(ctx, entries)
}

func (s *switchStore) Submit(ctx context.Context, entries []buffer.Entry) (func() ([]buffer.Outcome, error), error) {
	return ingest.CommitFunc(s.Commit).Submit(ctx, entries)
}

func (s *switchStore) setFailing(fail bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = fail
}

func (s *switchStore) attempts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tries
}

// testWriter sends log lines to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
