package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/gateway/httpserve"
	"greenhouse-gateway/internal/delivery"
	"greenhouse-gateway/operator"
	"greenhouse-gateway/registry"
)

const testAdminToken = "operator-token"

// serveGateway runs the gateway's real HTTP API (operator endpoints,
// /readyz, /metrics) over buf on a loopback port and returns its URL.
func serveGateway(t *testing.T, buf *buffer.Buffer, reg *prometheus.Registry) string {
	t.Helper()
	devices, err := registry.New(registry.Config{}, buf, nil, nil, reg)
	require.NoError(t, err)
	require.NoError(t, devices.Load())
	ready := func() error { return nil }
	ops := operator.New(operator.Deps{Devices: devices, AdminToken: testAdminToken, DeadLetters: buf, Ready: ready}, nil)
	api, err := httpserve.NewHTTPServer(httpserve.HTTPConfig{Addr: "127.0.0.1:0"}, httpserve.HTTPDeps{
		Routes: ops.Routes, Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), Ready: ready,
	}, nil)
	require.NoError(t, err)
	require.NoError(t, api.Listen())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := api.Run(ctx); err != nil {
			t.Errorf("HTTP API: %v", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return "http://" + api.Addr()
}

// runningFixture is newFixture's buffer served by a running gateway API.
func runningFixture(t *testing.T) (fixture, string) {
	t.Helper()
	f := newFixture(t, false)
	reg := prometheus.NewRegistry()
	buf, err := buffer.Open(f.dir, buffer.Options{}, nil, reg)
	require.NoError(t, err)
	f.buf = buf
	t.Cleanup(func() { require.NoError(t, buf.Close()) })
	return f, serveGateway(t, buf, reg)
}

func TestStatusOfAGatewayWithoutUplinkReport(t *testing.T) {
	f, base := runningFixture(t)
	env := map[string]string{envAdminToken: testAdminToken}
	r := ctl(t, env, "status", "--url", base)
	require.Equal(t, exitOK, r.code)
	for _, want := range []string{
		"gatewayd at " + base + ": ready",
		"uplink: unknown (from /metrics)",
		"backlog: 3 batches",
		"devices: 0 known",
		"dead letters: 1",
		f.dead,
		deadReason,
		"/v1/uplink: 404: no uplink runs in this gateway",
	} {
		require.Contains(t, r.stdout, want)
	}

	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(testAdminToken+"\n"), 0o600))
	r = ctl(t, nil, "status", "--url", base, "--admin-token-file", tokenFile, "--json")
	require.Equal(t, exitOK, r.code)
	var rep statusReport
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep))
	require.True(t, rep.Ready)
	require.Nil(t, rep.Uplink)
	require.Equal(t, &metricsBacklog{PendingBatches: 3, PendingBytes: f.buf.Stats().PendingBytes,
		OldestAgeSeconds: rep.Backlog.OldestAgeSeconds}, rep.Backlog)
	require.Positive(t, rep.Backlog.OldestAgeSeconds)
	require.Equal(t, 1, *rep.DeadLetters)
	require.Empty(t, rep.Missing)
	require.Contains(t, rep.Problems, "/v1/uplink: 404: no uplink runs in this gateway")

	r = ctl(t, nil, "status", "--url", base)
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stdout, "ready")
	require.Contains(t, r.stdout, "note: no admin token given")
}

func TestStatusErrors(t *testing.T) {
	_, base := runningFixture(t)
	// A port nothing listens on: bind one, then close it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := "http://" + l.Addr().String()
	require.NoError(t, l.Close())

	tests := []struct {
		name string
		env  map[string]string
		args []string
		code int
		want string
	}{
		{"nothing listening", nil, []string{"status", "--url", closed}, exitError,
			"gatewayd is not answering on " + closed + " (connection refused)"},
		{"wrong token", map[string]string{envAdminToken: "nope"}, []string{"status", "--url", base}, exitError,
			"admin token rejected by gatewayd at " + base},
		{"wrong token, reforward", map[string]string{envAdminToken: "nope"}, []string{"buffer", "reforward", "--url", base, "x"},
			exitError, "admin token rejected"},
		{"missing token file", nil, []string{"status", "--url", base, "--admin-token-file", "/nonexistent/token"}, exitError,
			"reading the admin token"},
		{"not a URL", nil, []string{"status", "--url", "127.0.0.1:8080"}, exitUsage, "is not an http:// or https:// URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ctl(t, tt.env, tt.args...)
			require.Equal(t, tt.code, r.code)
			require.Contains(t, r.stderr, tt.want)
		})
	}
}

func TestDeadLettersThroughARunningGateway(t *testing.T) {
	f, base := runningFixture(t)
	env := map[string]string{envAdminToken: testAdminToken}
	r := ctl(t, env, "buffer", "dead-letters", "--url", base)
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stdout, "dead letters: 1")
	require.Contains(t, r.stdout, deadReason)

	r = ctl(t, env, "buffer", "reforward", "--url", base, f.dead)
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stdout, "re-forwarded "+f.dead+" (hardware_id "+hwA+")")
	ps, err := f.buf.Pending(0, 10)
	require.NoError(t, err)
	require.Len(t, ps, 4)
	require.Equal(t, f.dead, ps[3].BatchID, "queued again at the end")

	for _, tt := range []struct{ id, want string }{
		{f.dead, "refusing: " + f.dead + " is pending"},
		{f.delivered, "refusing: " + f.delivered + " was delivered at"},
		{"AA:BB:CC:DD:EE:01_boot_99", "refusing: no batch AA:BB:CC:DD:EE:01_boot_99 in the buffer"},
	} {
		r := ctl(t, env, "buffer", "reforward", "--url", base, tt.id)
		require.Equal(t, exitError, r.code)
		require.Contains(t, r.stderr, tt.want)
	}
	r = ctl(t, env, "buffer", "dead-letters", "--url", base, "--json")
	require.Equal(t, exitOK, r.code)
	require.JSONEq(t, `{"count":0,"dead_letters":[]}`, r.stdout)
}

func TestStatusPrintsTheUplinkReport(t *testing.T) {
	since := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	errAt := since.Add(time.Minute)
	eta := 90.0
	report := delivery.Report{State: "down", Since: since, BacklogBatches: 12, BacklogBytes: 3 << 10,
		OldestAgeSeconds: 125, DrainRateBatches: 0.5, ETASeconds: &eta, LastError: "dial tcp 10.0.0.1:443: i/o timeout",
		LastErrorAt: &errAt, FailedRounds: 7}
	// The gateway's real API answers /readyz, devices and dead letters; the
	// uplink report comes from a gateway version that serves it.
	_, real := runningFixture(t)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/uplink", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+testAdminToken {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(report)
	})
	target, err := url.Parse(real)
	require.NoError(t, err)
	mux.Handle("/", httputil.NewSingleHostReverseProxy(target))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	env := map[string]string{envAdminToken: testAdminToken}
	r := ctl(t, env, "status", "--url", srv.URL)
	require.Equal(t, exitOK, r.code)
	for _, want := range []string{
		"uplink: down since 2026-03-01T10:00:00Z",
		"backlog: 12 batches, 3.0 KiB, oldest 2m5s old",
		"draining: 0.5 batches/s, empty in about 1m30s",
		"last error at 2026-03-01T10:01:00Z: dial tcp 10.0.0.1:443: i/o timeout (failed rounds: 7)",
		"dead letters: 1",
	} {
		require.Contains(t, r.stdout, want)
	}
	require.NotContains(t, r.stdout, "not available")

	r = ctl(t, env, "status", "--url", srv.URL, "--json")
	require.Equal(t, exitOK, r.code)
	var rep statusReport
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep))
	sent, err := json.Marshal(report)
	require.NoError(t, err)
	got, err := json.Marshal(rep.Uplink)
	require.NoError(t, err)
	require.JSONEq(t, string(sent), string(got))
	require.Nil(t, rep.Backlog)
	require.True(t, strings.HasPrefix(rep.URL, "http://127.0.0.1:"))
}
