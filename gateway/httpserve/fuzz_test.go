package httpserve_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
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

// vectorsDir holds the test vectors shared with firmware authors.
const vectorsDir = "../../firmware-contract/testdata"

// vector is one entry of the vectors' index (vectors.json); the fuzz
// targets seed their corpus with the payloads.
type vector struct {
	File   string `json:"file"`
	Sender string `json:"sender"`
	NowMS  int64  `json:"now_ms"`
}

// fuzzVectors returns the payloads of firmware-contract/testdata/<dir>
// with their vectors.
func fuzzVectors(f *testing.F, dir string) (payloads [][]byte, vectors []vector) {
	f.Helper()
	raw, err := os.ReadFile(filepath.Join(vectorsDir, "vectors.json"))
	require.NoError(f, err)
	var all []vector
	require.NoError(f, json.Unmarshal(raw, &all))
	for _, v := range all {
		if !strings.HasPrefix(v.File, dir+"/") {
			continue
		}
		p, err := os.ReadFile(filepath.Join(vectorsDir, v.File))
		require.NoError(f, err)
		payloads = append(payloads, p)
		vectors = append(vectors, v)
	}
	require.NotEmpty(f, payloads)
	return payloads, vectors
}

// settableClock is a gateway clock each fuzz input sets.
type settableClock struct{ ms atomic.Int64 }

func (c *settableClock) Now() time.Time  { return time.UnixMilli(c.ms.Load()) }
func (c *settableClock) Plausible() bool { return true }

// memStore is a Committer in memory that can be told to fail or to be
// full, to reach the 503 and 507 answers.
type memStore struct {
	mu      sync.Mutex
	batches map[string][32]byte
	mode    atomic.Int32 // 0 works, 1 fails, 2 full
}

func (m *memStore) Commit(_ context.Context, entries []buffer.Entry) ([]buffer.Outcome, error) {
	switch m.mode.Load() {
	case 1:
		return nil, errors.New("injected: input/output error")
	case 2:
		out := make([]buffer.Outcome, len(entries))
		for i := range out {
			out[i] = buffer.Full
		}
		return out, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]buffer.Outcome, len(entries))
	for i, e := range entries {
		switch h, ok := m.batches[e.BatchID]; {
		case !ok:
			m.batches[e.BatchID] = e.Hash
			out[i] = buffer.Stored
		case h == e.Hash:
			out[i] = buffer.Duplicate
		default:
			out[i] = buffer.Conflict
		}
	}
	return out, nil
}

func (m *memStore) Submit(ctx context.Context, entries []buffer.Entry) (func() ([]buffer.Outcome, error), error) {
	return ingest.CommitFunc(m.Commit).Submit(ctx, entries)
}

// fuzzAPI is the HTTP API's handler over a memStore, served without a
// listener so that a panic fails the fuzz target.
type fuzzAPI struct {
	handler http.Handler
	clock   *settableClock
	store   *memStore
}

func newFuzzAPI(f *testing.F) *fuzzAPI {
	f.Helper()
	buf, err := buffer.Open(f.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(f, err)
	f.Cleanup(func() { _ = buf.Close() })
	reg := prometheus.NewRegistry()
	clock := &settableClock{}
	clock.ms.Store(time.Now().UnixMilli())
	store := &memStore{batches: map[string][32]byte{}}
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
	a.store.mode.Store(int32(sel>>2&3) % 3)
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
	payloads, vectors := fuzzVectors(f, "readings")
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
	payloads, vectors := fuzzVectors(f, "register")
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
