package httpserve_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/gateway/auth"
	"greenhouse-gateway/gateway/httpserve"
	"greenhouse-gateway/gateway/ingest"
	"greenhouse-gateway/harness/gatewaytest"
	"greenhouse-gateway/operator"
	"greenhouse-gateway/registry"
)

// settableClock is a gateway clock each fuzz input sets.
type settableClock struct{ ms atomic.Int64 }

func (c *settableClock) Now() time.Time  { return time.UnixMilli(c.ms.Load()) }
func (c *settableClock) Plausible() bool { return true }

// fuzzAPI is the HTTP API's handler over a gatewaytest.MemStore, served without a
// listener so that a panic fails the fuzz target.
type fuzzAPI struct {
	handler http.Handler
	clock   *settableClock
	store   *gatewaytest.MemStore
}

func newFuzzAPI(f *testing.F) *fuzzAPI {
	f.Helper()
	buf, err := buffer.Open(f.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(f, err)
	f.Cleanup(func() { _ = buf.Close() })
	reg := prometheus.NewRegistry()
	clock := &settableClock{}
	clock.ms.Store(time.Now().UnixMilli())
	store := gatewaytest.NewMemStore()
	authn, err := auth.NewAuthenticator(auth.AuthConfig{}, auth.Peppers{Current: gatewaytest.Pepper}, gatewaytest.NewFakeKeys(), buf, nil, nil, reg)
	require.NoError(f, err)
	require.NoError(f, authn.Load())
	devices, err := registry.New(registry.Config{}, buf, clock, nil, reg)
	require.NoError(f, err)
	require.NoError(f, devices.Load())
	ing, err := ingest.New(ingest.Config{}, ingest.Deps{Store: store, Devices: devices, Clock: clock, Registerer: reg})
	require.NoError(f, err)
	api, err := httpserve.NewHTTPServer(httpserve.HTTPConfig{MaxBodyBytes: 64 << 10}, httpserve.HTTPDeps{
		Ingest: ing, Auth: authn, Routes: operator.New(operator.Deps{Devices: devices}, nil).Routes, Metrics: http.NotFoundHandler(),
		Ready: func() error { return nil },
	}, nil)
	require.NoError(f, err)
	return &fuzzAPI{handler: httpserve.HTTPHandler(api), clock: clock, store: store}
}

// serve posts body to path; sel picks the credentials (bits 0-1: bearer,
// X-API-Key, none, unknown key) and the store's mode (bits 2-3: works,
// fails, full).
func (a *fuzzAPI) serve(path string, body []byte, sel uint8) *httptest.ResponseRecorder {
	a.store.Mode.Store(int32(sel>>2&3) % 3)
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	switch sel & 3 {
	case 0:
		req.Header.Set("Authorization", "Bearer "+gatewaytest.GoodKey)
	case 1:
		req.Header.Set("X-API-Key", gatewaytest.GoodKey)
	case 3:
		req.Header.Set("Authorization", "Bearer "+gatewaytest.OtherKey)
	}
	rec := httptest.NewRecorder()
	a.handler.ServeHTTP(rec, req)
	return rec
}

// requireJSONAnswer checks what every device answer must be: JSON, and no
// 5xx but 503 and 507 (both with Retry-After).
func requireJSONAnswer(t *testing.T, rec *httptest.ResponseRecorder, allowed ...int) {
	t.Helper()
	require.Contains(t, allowed, rec.Code, "%s", rec.Body)
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	require.True(t, json.Valid(rec.Body.Bytes()), "not JSON: %q", rec.Body)
	if rec.Code == http.StatusServiceUnavailable || rec.Code == http.StatusInsufficientStorage {
		require.NotEmpty(t, rec.Header().Get("Retry-After"))
	}
}

func FuzzHTTPReadings(f *testing.F) {
	payloads, vectors := gatewaytest.FuzzVectors(f, "readings")
	for i, p := range payloads {
		f.Add(p, vectors[i].NowMS, uint8(0))
		f.Add([]byte(`{"batches":[`+string(p)+`,`+string(p)+`]}`), vectors[i].NowMS, uint8(0))
	}
	f.Add(payloads[0], vectors[0].NowMS, uint8(1|1<<2))
	f.Add(payloads[0], vectors[0].NowMS, uint8(2<<2))
	f.Add(payloads[0], vectors[0].NowMS, uint8(3))
	f.Add([]byte(`{"batches":[]}`), int64(0), uint8(0))
	api := newFuzzAPI(f)
	f.Fuzz(func(t *testing.T, body []byte, nowMS int64, sel uint8) {
		api.clock.ms.Store(nowMS)
		rec := api.serve("/v1/readings", body, sel)
		requireJSONAnswer(t, rec, 200, 207, 400, 401, 409, 413, 503, 507)
		var resp contract.ReadingsResponse
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &resp))
		s := resp.Summary
		require.Equal(t, len(resp.Results), s.Received)
		require.Equal(t, s.Received, s.Accepted+s.Duplicates+s.Rejected)
		if s.Received == 0 {
			require.NotEmpty(t, resp.Message, "an answer without results says why")
			return
		}
		require.Equal(t, resp.HTTPStatus(), rec.Code)
		for _, r := range resp.Results {
			switch r.Status {
			case contract.StatusAccepted, contract.StatusDuplicate:
				require.Nil(t, r.Reason)
			case contract.StatusRejected:
				require.NotNil(t, r.Reason)
				require.NotNil(t, r.Message)
				require.NotEmpty(t, *r.Message)
			default:
				t.Fatalf("status %q", r.Status)
			}
		}
	})
}

func FuzzHTTPRegister(f *testing.F) {
	payloads, vectors := gatewaytest.FuzzVectors(f, "register")
	for i, p := range payloads {
		f.Add(p, vectors[i].NowMS, uint8(0))
	}
	f.Add(payloads[0], vectors[0].NowMS, uint8(1))
	f.Add(payloads[0], vectors[0].NowMS, uint8(2))
	api := newFuzzAPI(f)
	f.Fuzz(func(t *testing.T, body []byte, nowMS int64, sel uint8) {
		api.clock.ms.Store(nowMS)
		rec := api.serve("/v1/register", body, sel&3) // the registry saves to disk, not the store
		requireJSONAnswer(t, rec, 200, 201, 400, 401, 413, 503, 507)
		switch rec.Code {
		case 200, 201:
			var ack contract.Ack
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &ack))
			require.Equal(t, contract.StatusRegistered, ack.Status)
			require.NotEmpty(t, ack.ConfirmationID)
		case 400:
			var ack contract.Ack
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &ack))
			require.Equal(t, contract.StatusRejected, ack.Status)
			require.NotNil(t, ack.Reason)
			require.NotEmpty(t, *ack.Message)
		}
	})
}
