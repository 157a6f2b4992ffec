package devicesim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/syncbuf"
)

// mintDeviceKey draws a device key and its key_id as the gateway does.
func mintDeviceKey(t testing.TB) (key, keyID string) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Errorf("drawing a device key: %v", err)
	}
	return hex.EncodeToString(b), uuid.NewString()
}

func readKeyStore(t *testing.T, path string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var keys map[string]string
	require.NoError(t, json.Unmarshal(raw, &keys))
	return keys
}

// enrollingGateway mimics the gateway's device HTTP API with auth.device_keys preferred: a
// registration with the fleet key of a device without a device key is answered with one;
// a device that has used its device key is refused the fleet key (403 device_key_required);
// a device key used for another device is refused (403 forbidden).
type enrollingGateway struct {
	t        testing.TB
	fleetKey string

	mu         sync.Mutex
	deviceKeys map[string]string   // device key -> hardware_id
	issued     map[string]int      // hardware_id -> device keys issued
	bound      map[string]bool     // hardware_id -> used its device key
	requests   map[string][]string // hardware_id -> "register/fleet", "readings/device", ... in order
	stored     map[string]bool     // batch_id
}

func newEnrollingGateway(t testing.TB, fleetKey string) *enrollingGateway {
	return &enrollingGateway{t: t, fleetKey: fleetKey, deviceKeys: map[string]string{}, issued: map[string]int{},
		bound: map[string]bool{}, requests: map[string][]string{}, stored: map[string]bool{}}
}

func (g *enrollingGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	token := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var hw, batchID string
	switch r.URL.Path {
	case "/v1/register":
		reg, err := contract.DecodeRegistration(body, "")
		if err != nil {
			g.t.Errorf("registration: %v", err)
			return
		}
		hw = reg.HardwareID
	case "/v1/readings":
		b, err := contract.DecodeBatch(body, "", contract.Limits{}, time.Now())
		if err != nil {
			g.t.Errorf("batch: %v", err)
			return
		}
		hw, batchID = b.HardwareID, b.BatchID
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	keyHW, isDevice := g.deviceKeys[token]
	kind := "fleet"
	if isDevice {
		kind = "device"
	}
	g.requests[hw] = append(g.requests[hw], strings.TrimPrefix(r.URL.Path, "/v1/")+"/"+kind)
	var refusal *contract.Error
	switch {
	case !isDevice && token != g.fleetKey:
		writeJSON(w, http.StatusUnauthorized, contract.RequestErrorResponse("unknown api key"))
		return
	case isDevice && keyHW != hw:
		refusal = contract.NewError(contract.ReasonForbidden, "hardware_id", "the key is bound to another device")
	case !isDevice && g.bound[hw]:
		refusal = contract.NewError(contract.ReasonDeviceKeyRequired, "hardware_id", "the device holds a device key; use it")
	case isDevice:
		g.bound[hw] = true
	}
	if batchID == "" {
		if refusal != nil {
			writeJSON(w, http.StatusForbidden, contract.RegisterAck("", refusal))
			return
		}
		ack := contract.RegisterAck("550e8400-e29b-41d4-a716-446655440000", nil)
		if !isDevice && g.issued[hw] == 0 {
			ack.DeviceKey, ack.DeviceKeyID = mintDeviceKey(g.t)
			g.deviceKeys[ack.DeviceKey] = hw
			g.issued[hw]++
		}
		writeJSON(w, http.StatusOK, ack)
		return
	}
	result := contract.NewResult(batchID, contract.StatusAccepted, nil)
	if refusal != nil {
		result = contract.NewResult(batchID, "", refusal)
	} else {
		g.stored[batchID] = true
	}
	resp := contract.NewReadingsResponse([]contract.Result{result})
	writeJSON(w, resp.HTTPStatus(), resp)
}

// keysOf returns the device keys issued, by hardware_id.
func (g *enrollingGateway) keysOf() map[string]string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := map[string]string{}
	for key, hw := range g.deviceKeys {
		out[hw] = key
	}
	return out
}

func (g *enrollingGateway) takeRequests() map[string][]string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := g.requests
	g.requests = map[string][]string{}
	return out
}

func enrollingConfig(url string) Config {
	cfg := fastConfig(20*time.Millisecond, 50*time.Millisecond, 10*time.Second)
	cfg.HTTPURL = url
	cfg.APIKey = "fleet"
	cfg.Devices = 2
	cfg.Batches = 2
	return cfg
}

func runSim(t *testing.T, cfg Config, logger *slog.Logger) []DeviceStats {
	t.Helper()
	sim, err := New(cfg, logger)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	require.NoError(t, sim.Run(ctx))
	require.NoError(t, ctx.Err(), "the simulator stopped by itself")
	return sim.Stats()
}

// TestHTTPModeEnrollsAndKeepsItsKeysAcrossRestarts: devices enroll over HTTP, use their
// device keys from then on, and a simulator restarted with the same key store uses the
// stored keys without enrolling again; one restarted without it has lost them and is refused.
func TestHTTPModeEnrollsAndKeepsItsKeysAcrossRestarts(t *testing.T) {
	gw := newEnrollingGateway(t, "fleet")
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	cfg := enrollingConfig(srv.URL)
	cfg.KeyStorePath = filepath.Join(t.TempDir(), "device-keys.json")

	for _, st := range runSim(t, cfg, testLogger(t)) {
		require.Equal(t, keyEnrolled, st.Key)
		require.Equal(t, 2, st.Accepted)
		require.Zero(t, st.Pending)
	}
	issued := gw.keysOf()
	require.Len(t, issued, 2)
	require.Equal(t, issued, readKeyStore(t, cfg.KeyStorePath), "the key store holds the keys issued")
	fi, err := os.Stat(cfg.KeyStorePath)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	for hw, reqs := range gw.takeRequests() {
		require.Equal(t, []string{"register/fleet", "register/device", "readings/device", "readings/device"}, reqs,
			"%s: enrolled with the fleet key, then everything with its device key", hw)
	}

	// A restart with the key store: the stored keys from the first request on.
	for _, st := range runSim(t, cfg, testLogger(t)) {
		require.Equal(t, keyStored, st.Key)
		require.Equal(t, 2, st.Accepted)
	}
	for hw, reqs := range gw.takeRequests() {
		require.Equal(t, []string{"register/device", "readings/device", "readings/device"}, reqs, hw)
	}
	require.Equal(t, issued, gw.keysOf(), "no second enrollment")

	// A restart without it: the devices lost their keys; the fleet key is refused, the
	// batches are kept, and the error says what to do.
	var logs syncbuf.Buffer
	lost := cfg
	lost.KeyStorePath = ""
	lost.RetryMax = 200 * time.Millisecond
	lost.DrainTimeout = time.Second
	for _, st := range runSim(t, lost, infoLogger(&logs)) {
		require.Equal(t, keyFleet, st.Key)
		require.Equal(t, 2, st.Pending, "batches refused for the key are kept")
		require.Positive(t, st.Retried[string(contract.ReasonDeviceKeyRequired)])
		require.Empty(t, st.Rejected)
	}
	out := logs.String()
	require.Contains(t, out, "level=ERROR msg=\"registration refused: the gateway wants the device's own device key")
	require.Contains(t, out, "level=ERROR msg=\"batch refused, keeping it")
	require.Contains(t, out, "gatewayctl devices reset-key")
	for hw, reqs := range gw.takeRequests() {
		// One second of drain with RetryMax 200 ms: a handful of attempts, not a loop.
		require.LessOrEqual(t, len(reqs), 16, "%s: %v", hw, reqs)
	}
	require.Equal(t, issued, gw.keysOf(), "a lost key is not issued again without an operator")
}
