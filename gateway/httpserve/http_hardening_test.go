package httpserve_test

import (
	"greenhouse-gateway/gateway/httpserve"
	"greenhouse-gateway/harness/gatewaytest"
)

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"
)

func TestEveryAnswerCarriesNosniff(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	tests := []struct {
		name, method, path string
		basic              bool
		code               int
	}{
		{"health", "GET", "/healthz", false, 200},
		{"readiness", "GET", "/readyz", false, 200},
		{"metrics", "GET", "/metrics", false, 200},
		{"status page", "GET", "/", true, 200},
		{"status page without token", "GET", "/", false, 401},
		{"operator JSON", "GET", "/v1/devices", true, 200},
		{"device API error", "POST", "/v1/readings", false, 401},
		{"not found", "GET", "/nope", false, 404},
		{"wrong method", "DELETE", "/v1/readings", false, 405},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, h.HTTPURL+tt.path, nil)
			require.NoError(t, err)
			if tt.basic {
				req.SetBasicAuth("operator", gatewaytest.AdminToken)
			}
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, tt.code, resp.StatusCode)
			require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))
			require.Equal(t, "DENY", resp.Header.Get("X-Frame-Options"))
		})
	}
}

// startOperatorAPI runs an operator-only HTTP API with cfg on a loopback
// port and returns it with its metrics registry.
func startOperatorAPI(t *testing.T, cfg httpserve.HTTPConfig) (*httpserve.HTTPServer, *prometheus.Registry) {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	reg := prometheus.NewRegistry()
	api, err := httpserve.NewHTTPServer(cfg, httpserve.HTTPDeps{Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		Ready: func() error { return nil }, Registerer: reg}, nil)
	require.NoError(t, err)
	require.NoError(t, api.Listen())
	ctx, cancel := gatewaytest.ContextWithCancel()
	done := make(chan error, 1)
	go func() { done <- api.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return api, reg
}

func TestHTTPTimeoutsComeFromTheSettings(t *testing.T) {
	api, _ := startOperatorAPI(t, httpserve.HTTPConfig{ReadHeaderTimeout: 300 * time.Millisecond,
		IdleTimeout: 400 * time.Millisecond})

	start := time.Now() // before the server's header timer starts
	half, err := net.Dial("tcp", api.Addr())
	require.NoError(t, err)
	defer half.Close()
	_, err = io.WriteString(half, "GET /healthz HTTP/1.1\r\nHost: x\r\n")
	require.NoError(t, err)
	// The default is 10s.
	require.Zero(t, gatewaytest.ClosedWithin(t, []net.Conn{half}, start.Add(200*time.Millisecond), 5*time.Second),
		"closed by the header timeout, not at once")

	idle, err := net.Dial("tcp", api.Addr())
	require.NoError(t, err)
	defer idle.Close()
	_, err = io.WriteString(idle, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(idle), nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	gatewaytest.ClosedWithin(t, []net.Conn{idle}, time.Time{}, 5*time.Second) // the default is 2m

	require.Equal(t, 30*time.Second, httpserve.DefaultHTTPConfig().ReadTimeout)
	timeouts := httpserve.HTTPTimeouts(api)
	require.Equal(t, [4]time.Duration{300 * time.Millisecond, 30 * time.Second, 30 * time.Second, 400 * time.Millisecond}, timeouts,
		"read header, read, write and idle timeouts")
}

func TestHTTPConfigValidateNamesTheSetting(t *testing.T) {
	for setting, cfg := range map[string]httpserve.HTTPConfig{
		"http.read_header_timeout": {ReadHeaderTimeout: -1},
		"http.read_timeout":        {ReadTimeout: -1},
		"http.write_timeout":       {WriteTimeout: -1},
		"http.idle_timeout":        {IdleTimeout: -1},
		"http.max_conns":           {MaxConns: -1},
		"http.max_conns_per_addr":  {MaxConnsPerAddr: -1},
	} {
		require.ErrorContains(t, cfg.Validate(), setting+": must not be negative")
	}
	d := httpserve.DefaultHTTPConfig()
	require.Equal(t, 1024, d.MaxConns)
	require.Equal(t, 64, d.MaxConnsPerAddr)
	require.Equal(t, 10*time.Second, d.ReadHeaderTimeout)
	require.Equal(t, 2*time.Minute, d.IdleTimeout)
	require.Equal(t, 8, httpserve.HTTPConfigWithDefaults(httpserve.HTTPConfig{MaxConns: 8}).MaxConnsPerAddr,
		"the per-address cap is at most the total")
}

// TestTLSHandshakeIsUnderAdmission: sockets that never start their TLS
// handshake are shed for a client that does, and closed by the header
// timeout.
func TestTLSHandshakeIsUnderAdmission(t *testing.T) {
	certFile, keyFile, pool := gatewaytest.SelfSigned(t)
	api, reg := startOperatorAPI(t, httpserve.HTTPConfig{TLSCertFile: certFile, TLSKeyFile: keyFile,
		MaxConns: 4, MaxConnsPerAddr: 4, ReadHeaderTimeout: 500 * time.Millisecond})
	var silent []net.Conn
	for i := range 4 { // from other addresses than the client's
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i))}}
		c, err := d.Dial("tcp", api.Addr())
		require.NoError(t, err)
		defer c.Close()
		silent = append(silent, c)
	}
	require.Eventually(t, func() bool {
		return gatewaytest.GatherValue(t, reg, "gateway_http_connections_open", "", "") == 4
	}, 10*time.Second, 5*time.Millisecond)

	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 5 * time.Second}
	resp, err := client.Get("https://" + api.Addr() + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))
	gatewaytest.ClosedWithin(t, silent[:1], time.Time{}, 5*time.Second)
	require.GreaterOrEqual(t, gatewaytest.GatherValue(t, reg, "gateway_http_connections_shed_total", "reason", "total_cap"), 1.0)
	gatewaytest.ClosedWithin(t, silent[1:], time.Time{}, 5*time.Second) // the handshake is under the header timeout
}
