package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/gateway"
	"greenhouse-gateway/internal/audit"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/firmware-contract"
)

const (
	pepper   = "test-pepper"
	goodKey  = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	otherKey = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
	// boundKey is key kB, bound to hwBound.
	boundKey = "b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0"
	hwBound  = "AA:00:00:00:00:0B"
)

// fakeKeys is an api_keys table in memory.
type fakeKeys struct {
	mu      sync.Mutex
	keys    map[string]cloud.KeyInfo // by key_id
	down    bool
	hits    int
	touched map[string]int
	wait    chan struct{} // when set, lookups wait for it to close
	waiting int           // lookups that waited
}

func newFakeKeys() *fakeKeys {
	return &fakeKeys{keys: map[string]cloud.KeyInfo{
		"k1": {KeyID: "k1", Hash: cloud.HashKey(pepper, goodKey), Active: true},
		"kB": {KeyID: "kB", Hash: cloud.HashKey(pepper, boundKey), Active: true, HardwareID: hwBound},
	}, touched: map[string]int{}}
}

func (f *fakeKeys) LookupHash(ctx context.Context, hash string) (cloud.KeyInfo, bool, error) {
	f.mu.Lock()
	if wait := f.wait; wait != nil {
		f.waiting++
		f.mu.Unlock()
		<-wait
		f.mu.Lock()
	}
	defer f.mu.Unlock()
	f.hits++
	if f.down {
		return cloud.KeyInfo{}, false, errors.New("connection refused")
	}
	for _, k := range f.keys {
		if k.Hash == hash {
			return k, true, nil
		}
	}
	return cloud.KeyInfo{}, false, nil
}

func (f *fakeKeys) TouchLastUsed(ctx context.Context, keyID string, t time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.touched[keyID]++
	return nil
}

func (f *fakeKeys) Rehash(ctx context.Context, keyID, oldHash, newHash string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := f.keys[keyID]
	if k.Hash != oldHash {
		return errors.New("conditional check failed")
	}
	k.Hash = newHash
	f.keys[keyID] = k
	return nil
}

func (f *fakeKeys) set(fn func(*fakeKeys)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// failingStore fails every commit, as a dying disk would.
type failingStore struct{}

func (failingStore) Commit(context.Context, []buffer.Entry) ([]buffer.Outcome, error) {
	return nil, errors.New("injected: input/output error")
}

type harness struct {
	buf        *buffer.Buffer
	devices    *gateway.Registry
	deviceKeys *gateway.DeviceKeys
	reg        *prometheus.Registry
	keys       *fakeKeys
	mqttAddr   string
	httpURL    string
	auditDir   string
}

// gatewayOptions change startGateway's configuration.
type gatewayOptions struct {
	ingest  gateway.IngestConfig
	devices gateway.DevicesConfig
	auth    gateway.AuthConfig
	clock   gateway.Clock
}

const adminToken = "admin-secret"

// startGateway runs the broker and HTTP API on loopback ports over a real
// buffer. A non-nil store replaces the buffer for commits.
func startGateway(t *testing.T, store gateway.Committer, options ...func(*gatewayOptions)) *harness {
	t.Helper()
	var opts gatewayOptions
	for _, o := range options {
		o(&opts)
	}
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, buf.Close()) })
	if store == nil {
		store = buf
	}
	reg := prometheus.NewRegistry()
	keys := newFakeKeys()
	auth, err := gateway.NewAuthenticator(opts.auth, gateway.Peppers{Current: pepper}, keys, buf, nil, reg)
	require.NoError(t, err)
	devices, err := gateway.NewRegistry(opts.devices, buf, opts.clock, nil, reg)
	require.NoError(t, err)
	ingest, err := gateway.NewIngest(opts.ingest, store, devices, opts.clock, nil, reg)
	require.NoError(t, err)
	deviceKeys, err := gateway.NewDeviceKeys(opts.auth.DeviceKeys, gateway.Peppers{Current: pepper}, buf, nil, reg)
	require.NoError(t, err)
	auth.UseDeviceKeys(deviceKeys)
	ingest.SetDeviceKeys(deviceKeys)
	auditDir := t.TempDir()
	auditLog, err := audit.Open(auditDir, audit.Config{}, nil, nil, reg)
	require.NoError(t, err)
	ingest.SetAudit(auditLog)
	broker, err := gateway.NewBroker(gateway.MQTTConfig{Addr: "127.0.0.1:0"}, ingest, auth, nil, reg)
	require.NoError(t, err)
	require.NoError(t, broker.Listen())
	api, err := gateway.NewHTTPServer(gateway.HTTPConfig{Addr: "127.0.0.1:0", MaxBodyBytes: 64 << 10}, gateway.HTTPDeps{
		Ingest: ingest, Auth: auth, Devices: devices, DeviceKeys: deviceKeys, History: buf, AdminToken: adminToken,
		DeadLetters: buf, Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), Ready: func() error { return nil },
		Audit: auditLog,
	}, nil)
	require.NoError(t, err)
	require.NoError(t, api.Listen())

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, run := range []func(context.Context) error{broker.Run, api.Run, auditLog.Run} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(ctx); err != nil {
				t.Errorf("gateway component: %v", err)
			}
		}()
	}
	t.Cleanup(func() {
		ingest.Stop()
		cancel()
		wg.Wait()
	})
	return &harness{buf: buf, devices: devices, deviceKeys: deviceKeys, reg: reg, keys: keys, mqttAddr: "tcp://" + broker.Addr(), httpURL: "http://" + api.Addr(),
		auditDir: auditDir}
}

// device is a real MQTT client (paho) that collects its acks.
type device struct {
	hw     string
	client paho.Client
	acks   chan contract.Ack
}

func connectDevice(t *testing.T, h *harness, hw, key string) (*device, error) {
	t.Helper()
	d := &device{hw: hw, acks: make(chan contract.Ack, 100)}
	opts := paho.NewClientOptions().AddBroker(h.mqttAddr).SetClientID(hw).
		SetUsername(hw).SetPassword(key).SetAutoReconnect(false).SetConnectRetry(false).
		SetConnectTimeout(10 * time.Second).SetCleanSession(true)
	d.client = paho.NewClient(opts)
	tok := d.client.Connect()
	if !tok.WaitTimeout(20 * time.Second) {
		return nil, errors.New("connect timed out")
	}
	if err := tok.Error(); err != nil {
		return nil, err
	}
	t.Cleanup(func() { d.client.Disconnect(100) })
	sub := d.client.Subscribe(contract.AckTopic(hw), 1, func(_ paho.Client, m paho.Message) {
		var a contract.Ack
		if err := json.Unmarshal(m.Payload(), &a); err != nil {
			t.Errorf("ack is not JSON: %s", m.Payload())
			return
		}
		d.acks <- a
	})
	require.True(t, sub.WaitTimeout(20*time.Second))
	require.NoError(t, sub.Error())
	return d, nil
}

// publish sends a readings payload at QoS 1 and returns the token that
// completes on PUBACK.
func (d *device) publish(payload []byte) paho.Token {
	return d.client.Publish(contract.ReadingsTopic(d.hw), 1, false, payload)
}

func (d *device) nextAck(t *testing.T) contract.Ack {
	t.Helper()
	select {
	case a := <-d.acks:
		return a
	case <-time.After(20 * time.Second):
		t.Fatal("no ack within 20s")
		return contract.Ack{}
	}
}

// batchJSON builds a valid batch of n readings, one second apart, ending now.
func batchJSON(hw, bootID string, window int, n int) []byte {
	end := time.Now().Add(-time.Minute).UnixMilli()
	start := end - int64(n)*1000
	b := map[string]any{
		"batch_id":         fmt.Sprintf("%s_%s_%d_%d", hw, bootID, start+int64(window), end+int64(window)),
		"hardware_id":      hw,
		"boot_id":          bootID,
		"firmware_version": "1.0.16",
	}
	var readings []map[string]any
	for i := range n {
		readings = append(readings, map[string]any{
			"timestamp_ms":  start + int64(i+1)*1000,
			"sensors":       map[string]any{"bme280_temp_c": 20.5 + float64(i), "humidity_pct": 45.2},
			"sensor_status": map[string]string{"bme280": "ok"},
		})
	}
	b["readings"] = readings
	out, _ := json.Marshal(b)
	return out
}

func newBoot() string { return uuid.NewString() }

func postJSON(t *testing.T, url, key string, body []byte) (*http.Response, contract.ReadingsResponse) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	require.NoError(t, err)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out contract.ReadingsResponse
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp, out
}

// reorder re-encodes a JSON object with its top-level keys in reverse
// order and indented: the same payload, other bytes.
func reorder(t *testing.T, payload []byte) []byte {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(payload, &m))
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Sort(sort.Reverse(sort.StringSlice(keys)))
	var b bytes.Buffer
	b.WriteString("{\n")
	for i, k := range keys {
		if i > 0 {
			b.WriteString(",\n")
		}
		fmt.Fprintf(&b, "  %q: %s", k, m[k])
	}
	b.WriteString("\n}")
	return b.Bytes()
}

func contextWithCancel() (context.Context, context.CancelFunc) {
	return context.WithCancel(context.Background())
}
