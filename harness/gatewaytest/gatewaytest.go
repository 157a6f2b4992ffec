// Package gatewaytest runs an in-process gateway for the tests of ingest,
// registry and operator: the device registry, the ingest path with its
// device keys and audit trail, the embedded MQTT broker and the HTTP server
// with the operator API mounted, on loopback ports over a real buffer, and
// the MQTT and HTTP clients that talk to it. It builds each part through
// its exported API only.
package gatewaytest

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
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/ingest"
	"greenhouse-gateway/internal/audit"
	"greenhouse-gateway/internal/clock"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/operator"
	"greenhouse-gateway/registry"
)

// The api_keys of NewFakeKeys, under Pepper.
const (
	Pepper   = "test-pepper"
	GoodKey  = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	OtherKey = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
	// BoundKey is key kB, bound to HWBound.
	BoundKey = "b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0"
	HWBound  = "AA:00:00:00:00:0B"
)

// FakeKeys is an api_keys table in memory (ingest.KeyStore). Change its
// fields under Set.
type FakeKeys struct {
	Mu      sync.Mutex               // guards the fields below
	Keys    map[string]cloud.KeyInfo // by key_id
	Down    bool                     // lookups fail
	Hits    int                      // lookups made
	Touched map[string]int           // last_used updates by key_id
	Wait    chan struct{}            // when set, lookups wait for it to close
	Waiting int                      // lookups that waited
}

// NewFakeKeys returns a table holding k1 (GoodKey) and kB (BoundKey,
// bound to HWBound).
func NewFakeKeys() *FakeKeys {
	return &FakeKeys{Keys: map[string]cloud.KeyInfo{
		"k1": {KeyID: "k1", Hash: cloud.HashKey(Pepper, GoodKey), Active: true},
		"kB": {KeyID: "kB", Hash: cloud.HashKey(Pepper, BoundKey), Active: true, HardwareID: HWBound},
	}, Touched: map[string]int{}}
}

// LookupHash implements ingest.KeyStore.
func (f *FakeKeys) LookupHash(ctx context.Context, hash string) (cloud.KeyInfo, bool, error) {
	f.Mu.Lock()
	if wait := f.Wait; wait != nil {
		f.Waiting++
		f.Mu.Unlock()
		<-wait
		f.Mu.Lock()
	}
	defer f.Mu.Unlock()
	f.Hits++
	if f.Down {
		return cloud.KeyInfo{}, false, errors.New("connection refused")
	}
	for _, k := range f.Keys {
		if k.Hash == hash {
			return k, true, nil
		}
	}
	return cloud.KeyInfo{}, false, nil
}

// TouchLastUsed implements ingest.KeyStore.
func (f *FakeKeys) TouchLastUsed(ctx context.Context, keyID string, t time.Time) error {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	f.Touched[keyID]++
	return nil
}

// Rehash implements ingest.KeyStore.
func (f *FakeKeys) Rehash(ctx context.Context, keyID, oldHash, newHash string) error {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	k := f.Keys[keyID]
	if k.Hash != oldHash {
		return errors.New("conditional check failed")
	}
	k.Hash = newHash
	f.Keys[keyID] = k
	return nil
}

// Set runs fn on f under its lock.
func (f *FakeKeys) Set(fn func(*FakeKeys)) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	fn(f)
}

// FailingStore fails every commit, as a dying disk would.
type FailingStore struct{}

// Commit fails.
func (FailingStore) Commit(context.Context, []buffer.Entry) ([]buffer.Outcome, error) {
	return nil, errors.New("injected: input/output error")
}

// Submit fails.
func (f FailingStore) Submit(ctx context.Context, entries []buffer.Entry) (func() ([]buffer.Outcome, error), error) {
	return ingest.CommitFunc(f.Commit).Submit(ctx, entries)
}

// Gateway is a running in-process gateway.
type Gateway struct {
	Buf        *buffer.Buffer
	Devices    *registry.Registry
	DeviceKeys *ingest.DeviceKeys
	Reg        *prometheus.Registry
	Keys       *FakeKeys
	MQTTAddr   string // tcp://host:port
	HTTPURL    string // http://host:port
	AuditDir   string
}

// Options change Start's configuration.
type Options struct {
	Ingest  ingest.Config
	Devices registry.Config
	Auth    ingest.AuthConfig
	Clock   clock.Source
}

// AdminToken is the operator API's admin token.
const AdminToken = "admin-secret"

// Start runs the broker and the HTTP server (device and operator routes)
// on loopback ports over a real buffer, until the test ends. A non-nil
// store replaces the buffer for commits.
func Start(t testing.TB, store ingest.Committer, options ...func(*Options)) *Gateway {
	t.Helper()
	var opts Options
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
	keys := NewFakeKeys()
	auth, err := ingest.NewAuthenticator(opts.Auth, ingest.Peppers{Current: Pepper}, keys, buf, nil, reg)
	require.NoError(t, err)
	devices, err := registry.New(opts.Devices, buf, opts.Clock, nil, reg)
	require.NoError(t, err)
	require.NoError(t, devices.Load())
	in, err := ingest.New(opts.Ingest, store, devices, opts.Clock, nil, reg)
	require.NoError(t, err)
	deviceKeys, err := ingest.NewDeviceKeys(opts.Auth.DeviceKeys, ingest.Peppers{Current: Pepper}, buf, nil, reg)
	require.NoError(t, err)
	auth.UseDeviceKeys(deviceKeys)
	in.SetDeviceKeys(deviceKeys)
	auditDir := t.TempDir()
	auditLog, err := audit.Open(auditDir, audit.Config{}, nil, nil, reg)
	require.NoError(t, err)
	in.SetAudit(auditLog)
	broker, err := ingest.NewBroker(ingest.MQTTConfig{Addr: "127.0.0.1:0"}, in, auth, nil, reg)
	require.NoError(t, err)
	require.NoError(t, broker.Listen())
	ready := func() error { return nil }
	ops := operator.New(operator.Deps{Devices: devices, DeviceKeys: deviceKeys, History: buf, AdminToken: AdminToken,
		DeadLetters: buf, Ready: ready, Audit: auditLog}, nil)
	api, err := ingest.NewHTTPServer(ingest.HTTPConfig{Addr: "127.0.0.1:0", MaxBodyBytes: 64 << 10}, ingest.HTTPDeps{
		Ingest: in, Auth: auth, Routes: ops.Routes, Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), Ready: ready,
	}, nil)
	require.NoError(t, err)
	require.NoError(t, api.Listen())

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, run := range []func(context.Context) error{broker.Run, api.Run, auth.Run, auditLog.Run} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(ctx); err != nil {
				t.Errorf("gateway component: %v", err)
			}
		}()
	}
	t.Cleanup(func() {
		in.Close()
		cancel()
		wg.Wait()
	})
	return &Gateway{Buf: buf, Devices: devices, DeviceKeys: deviceKeys, Reg: reg, Keys: keys, MQTTAddr: "tcp://" + broker.Addr(),
		HTTPURL: "http://" + api.Addr(), AuditDir: auditDir}
}

// Device is a real MQTT client (paho) that collects its acks.
type Device struct {
	HW     string
	Client paho.Client
	Acks   chan contract.Ack
}

// ConnectDevice connects hw to g's broker with key, subscribed to its ack
// topic, until the test ends.
func ConnectDevice(t testing.TB, g *Gateway, hw, key string) (*Device, error) {
	t.Helper()
	d := &Device{HW: hw, Acks: make(chan contract.Ack, 100)}
	opts := paho.NewClientOptions().AddBroker(g.MQTTAddr).SetClientID(hw).
		SetUsername(hw).SetPassword(key).SetAutoReconnect(false).SetConnectRetry(false).
		SetConnectTimeout(10 * time.Second).SetCleanSession(true)
	d.Client = paho.NewClient(opts)
	tok := d.Client.Connect()
	if !tok.WaitTimeout(20 * time.Second) {
		return nil, errors.New("connect timed out")
	}
	if err := tok.Error(); err != nil {
		return nil, err
	}
	t.Cleanup(func() { d.Client.Disconnect(100) })
	sub := d.Client.Subscribe(contract.AckTopic(hw), 1, func(_ paho.Client, m paho.Message) {
		var a contract.Ack
		if err := json.Unmarshal(m.Payload(), &a); err != nil {
			t.Errorf("ack is not JSON: %s", m.Payload())
			return
		}
		d.Acks <- a
	})
	require.True(t, sub.WaitTimeout(20*time.Second))
	require.NoError(t, sub.Error())
	return d, nil
}

// Publish sends a readings payload at QoS 1 and returns the token that
// completes on PUBACK.
func (d *Device) Publish(payload []byte) paho.Token {
	return d.Client.Publish(contract.ReadingsTopic(d.HW), 1, false, payload)
}

// NextAck waits up to 20 seconds for the next ack.
func (d *Device) NextAck(t testing.TB) contract.Ack {
	t.Helper()
	select {
	case a := <-d.Acks:
		return a
	case <-time.After(20 * time.Second):
		t.Fatal("no ack within 20s")
		return contract.Ack{}
	}
}

// Register publishes a registration and waits for its ack.
func (d *Device) Register(t testing.TB, payload []byte) contract.Ack {
	t.Helper()
	tok := d.Client.Publish(contract.RegisterTopic(d.HW), 1, false, payload)
	require.True(t, tok.WaitTimeout(20*time.Second))
	require.NoError(t, tok.Error())
	return d.NextAck(t)
}

// AdminDo sends an operator request with token (none when empty),
// decodes the answer into out (when not nil) and returns its status code.
func AdminDo(t testing.TB, g *Gateway, method, path, token string, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, g.HTTPURL+path, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	if out != nil {
		require.NoError(t, json.NewDecoder(resp.Body).Decode(out))
	}
	return resp.StatusCode
}

// AdminGet is AdminDo of a GET with the admin token.
func AdminGet(t testing.TB, g *Gateway, path string, out any) int {
	t.Helper()
	return AdminDo(t, g, http.MethodGet, path, AdminToken, out)
}

// Registration is a valid registration of hw in boot.
func Registration(hw, boot string) []byte {
	return []byte(fmt.Sprintf(`{"hardware_id":"%s","boot_id":"%s","firmware_version":"1.0.16","friendly_name":"greenhouse-sensor-01",
	 "capabilities":{"sensors":["bme280","soil_moisture"],"features":{"tft_display":true,"offline_buffering":true}}}`, hw, boot))
}

// BatchJSON builds a valid batch of n readings, one second apart, ending a
// minute ago; window shifts its batch_id.
func BatchJSON(hw, bootID string, window int, n int) []byte {
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

// NewBoot returns a new boot_id.
func NewBoot() string { return uuid.NewString() }

// PostJSON posts body to url with key (none when empty) and decodes the
// answer.
func PostJSON(t testing.TB, url, key string, body []byte) (*http.Response, contract.ReadingsResponse) {
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

// Reorder re-encodes a JSON object with its top-level keys in reverse
// order and indented: the same payload, other bytes.
func Reorder(t testing.TB, payload []byte) []byte {
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

// ContextWithCancel returns a cancellable background context.
func ContextWithCancel() (context.Context, context.CancelFunc) {
	return context.WithCancel(context.Background())
}
