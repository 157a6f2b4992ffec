package httpserve

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/gateway/auth"
	"greenhouse-gateway/gateway/ingest"
	"greenhouse-gateway/gateway/internal/listen"
	"greenhouse-gateway/internal/audit"
	"greenhouse-gateway/internal/httpapi"
)

type HTTPConfig struct {
	// Addr is the TCP listen address. Default ":8080".
	Addr string `yaml:"addr"`
	// MaxBodyBytes is the largest request body accepted; larger ones get
	// 413. Default 1048576 (1 MiB).
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// RetryAfter is the Retry-After sent with 429, 503 and 507 answers.
	// Default 30s.
	RetryAfter time.Duration `yaml:"retry_after"`
	// TLSCertFile and TLSKeyFile, when both set, serve HTTPS (TLS 1.2 or
	// later) with this PEM certificate and key.
	TLSCertFile string `yaml:"tls_cert_file"`
	TLSKeyFile  string `yaml:"tls_key_file"`
	// ReadHeaderTimeout bounds the reading of each request's line and
	// headers, and the TLS handshake (net/http gives the handshake the
	// least of this, ReadTimeout and WriteTimeout). Default 10s.
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	// ReadTimeout bounds the reading of a whole request, headers and body.
	// Default 30s.
	ReadTimeout time.Duration `yaml:"read_timeout"`
	// WriteTimeout bounds a request from the end of its headers to the end
	// of its answer. Default 30s.
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// IdleTimeout is how long a keep-alive connection may wait for the
	// first byte of its next request. Default 2m.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxConns caps open connections. At the cap, the connection that has
	// waited longest outside a handler (new, sending its headers, or idle)
	// is closed for the newcomer; when every one is inside a handler, the
	// newcomer is closed. Default 1024.
	MaxConns int `yaml:"max_conns"`
	// MaxConnsPerAddr caps the open connections of one source (an IPv4
	// address, an IPv6 /64) the same way. Default 64; at most MaxConns.
	MaxConnsPerAddr int `yaml:"max_conns_per_addr"`
}

// Defaults of the HTTP connection limits (see HTTPConfig).
const (
	defaultHTTPReadHeaderTimeout = 10 * time.Second
	defaultHTTPReadTimeout       = 30 * time.Second
	defaultHTTPWriteTimeout      = 30 * time.Second
	defaultHTTPIdleTimeout       = 2 * time.Minute
	defaultHTTPMaxConns          = 1024
	defaultHTTPMaxConnsPerAddr   = 64
)

func (c HTTPConfig) withDefaults() HTTPConfig {
	if c.Addr == "" {
		c.Addr = ":8080"
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 1 << 20
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = 30 * time.Second
	}
	c.ReadHeaderTimeout = cmp.Or(c.ReadHeaderTimeout, defaultHTTPReadHeaderTimeout)
	c.ReadTimeout = cmp.Or(c.ReadTimeout, defaultHTTPReadTimeout)
	c.WriteTimeout = cmp.Or(c.WriteTimeout, defaultHTTPWriteTimeout)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, defaultHTTPIdleTimeout)
	c.MaxConns = cmp.Or(c.MaxConns, defaultHTTPMaxConns)
	c.MaxConnsPerAddr = min(cmp.Or(c.MaxConnsPerAddr, defaultHTTPMaxConnsPerAddr), c.MaxConns)
	return c
}

// DefaultHTTPConfig returns the defaults of every HTTP setting.
func DefaultHTTPConfig() HTTPConfig { return HTTPConfig{}.withDefaults() }

// Validate reports the first invalid field.
func (c HTTPConfig) Validate() error {
	if c.MaxBodyBytes < 0 {
		return errors.New("http.max_body_bytes: must not be negative")
	}
	if c.RetryAfter < 0 {
		return errors.New("http.retry_after: must not be negative")
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return errors.New("http.tls_cert_file and http.tls_key_file: set both or neither")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"read_header_timeout", c.ReadHeaderTimeout}, {"read_timeout", c.ReadTimeout},
		{"write_timeout", c.WriteTimeout}, {"idle_timeout", c.IdleTimeout}} {
		if d.v < 0 {
			return fmt.Errorf("http.%s: must not be negative", d.name)
		}
	}
	if c.MaxConns < 0 {
		return errors.New("http.max_conns: must not be negative")
	}
	if c.MaxConnsPerAddr < 0 {
		return errors.New("http.max_conns_per_addr: must not be negative")
	}
	return nil
}

// HTTPDeps are what the HTTP server serves.
type HTTPDeps struct {
	// Ingest and Auth serve the device API (POST /v1/readings and
	// /v1/register); without both it is not served.
	Ingest *ingest.Ingest
	Auth   *auth.Authenticator
	// Routes mounts further routes on the server's mux: the operator API
	// (operator.API.Routes), which shares this listener; nil mounts none.
	Routes func(mux *http.ServeMux)
	// Metrics serves /metrics.
	Metrics http.Handler
	// Ready reports whether the gateway can take batches (for /readyz).
	Ready func() error
	// Registerer takes the connection metrics; nil keeps them private.
	Registerer prometheus.Registerer
}

// HTTPServer serves the device API, the routes mounted by HTTPDeps.Routes,
// metrics and health endpoints on one listener, behind connection
// admission (httpadmit.go), TLS when configured, and common headers.
type HTTPServer struct {
	cfg      HTTPConfig
	deps     HTTPDeps
	ingest   *ingest.Ingest
	auth     *auth.Authenticator
	logger   *slog.Logger
	server   *http.Server
	listener net.Listener
	admit    *admission
	// served is set once Run hands the listener to the server, which
	// then closes it.
	served atomic.Bool
}

// NewHTTPServer returns the HTTP server; it does not listen yet.
func NewHTTPServer(cfg HTTPConfig, deps HTTPDeps, logger *slog.Logger) (*HTTPServer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Metrics == nil || deps.Ready == nil {
		return nil, errors.New("gateway: the HTTP API needs Metrics and Ready")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	reg := deps.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	cfg = cfg.withDefaults()
	logger = logger.With("component", "http")
	h := &HTTPServer{cfg: cfg, deps: deps, ingest: deps.Ingest, auth: deps.Auth, logger: logger,
		admit: newAdmission(cfg.MaxConns, cfg.MaxConnsPerAddr, logger, reg)}
	mux := http.NewServeMux()
	if deps.Ingest != nil && deps.Auth != nil { // else the mounted routes only
		mux.HandleFunc("POST /v1/readings", h.readings)
		mux.HandleFunc("POST /v1/register", h.register)
	}
	if deps.Routes != nil {
		deps.Routes(mux)
	}
	mux.Handle("GET /metrics", deps.Metrics)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := h.deps.Ready(); err != nil {
			httpapi.WriteJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "message": err.Error()})
			return
		}
		httpapi.WriteJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	h.server = &http.Server{
		Handler:           inHandler(commonHeaders(mux)),
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    16 << 10,
		ConnContext:       connContext,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelDebug),
	}
	return h, nil
}

// Listen binds the TCP listener: the server's start, before Run, so that
// the caller knows the address (and that it is free) before it reports
// ready. Run listens itself when Listen was not called.
func (h *HTTPServer) Listen() error {
	tlsConfig, err := listen.LoadTLS(h.cfg.TLSCertFile, h.cfg.TLSKeyFile)
	if err != nil {
		return fmt.Errorf("http TLS: %w", err)
	}
	l, err := listen.TCP(h.cfg.Addr, h.cfg.ReadHeaderTimeout)
	if err != nil {
		return fmt.Errorf("listening for HTTP on %s: %w", h.cfg.Addr, err)
	}
	// Admission sits under TLS: a shed connection is closed at the TCP
	// level, at once, without a TLS alert that could wait on its peer.
	l = admitListener{Listener: l, adm: h.admit}
	if tlsConfig != nil {
		l = tls.NewListener(l, tlsConfig)
	}
	h.listener = l
	return nil
}

// Addr returns the bound address (after Listen).
func (h *HTTPServer) Addr() string { return h.listener.Addr().String() }

// Run serves until ctx is done, then shuts down, letting requests in
// progress finish for up to 10 seconds.
func (h *HTTPServer) Run(ctx context.Context) error {
	if h.listener == nil {
		if err := h.Listen(); err != nil {
			return err
		}
	}
	h.served.Store(true)
	h.logger.Info("HTTP API listening", "addr", h.Addr())
	errc := make(chan error, 1)
	go func() { errc <- h.server.Serve(h.listener) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serving HTTP: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.server.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutting down HTTP: %w", err)
	}
	return nil
}

// Close releases the listener of a server that was started (Listen) but
// never run; after Run, which closes everything it served, it does
// nothing.
func (h *HTTPServer) Close() error {
	if h.listener == nil || h.served.Load() {
		return nil
	}
	return h.listener.Close()
}

// deviceRequest authenticates a device request and reads its body; it has
// answered the request when ok is false. sender tells the ingest path the
// principal and the sender's address.
func (h *HTTPServer) deviceRequest(w http.ResponseWriter, r *http.Request) (sender ingest.Sender, body []byte, ok bool) {
	if h.ingest.Stopping() {
		h.unavailable(w, "the gateway is shutting down; retry later")
		return ingest.Sender{}, nil, false
	}
	p, err := h.auth.Identify(r.Context(), httpapi.APIKey(r))
	switch {
	case errors.Is(err, auth.ErrAuthUnavailable):
		h.auditRequest(r, audit.ReasonAuthUnavailable, "the API key cannot be verified now")
		h.unavailable(w, "the API key cannot be verified now; retry later")
		return ingest.Sender{}, nil, false
	case err != nil:
		h.auditRequest(r, audit.ReasonUnauthorized, "missing, unknown or revoked API key")
		httpapi.WriteJSON(w, http.StatusUnauthorized, errorBody("missing, unknown or revoked API key (Authorization: Bearer KEY)"))
		return ingest.Sender{}, nil, false
	}
	body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		h.auditRequest(r, audit.ReasonOversize, fmt.Sprintf("body over %d bytes", h.cfg.MaxBodyBytes))
		httpapi.WriteJSON(w, http.StatusRequestEntityTooLarge,
			errorBody(fmt.Sprintf("request body is larger than %d bytes", h.cfg.MaxBodyBytes)))
		return ingest.Sender{}, nil, false
	case err != nil:
		httpapi.WriteJSON(w, http.StatusBadRequest, errorBody("reading the request body: "+err.Error()))
		return ingest.Sender{}, nil, false
	}
	return ingest.Sender{RemoteAddr: r.RemoteAddr, Principal: &p}, body, true
}

// register answers 201 with the register ack at a device's first
// registration, 200 at the next ones, 400 when invalid, 403 when the key
// may not register this device.
func (h *HTTPServer) register(w http.ResponseWriter, r *http.Request) {
	sender, body, ok := h.deviceRequest(w, r)
	if !ok {
		return
	}
	ack, first, err := h.ingest.Register(r.Context(), sender, body)
	switch reason := contract.AsError(err); {
	case errors.Is(err, ingest.ErrShuttingDown):
		h.unavailable(w, "the gateway is shutting down; retry later")
	case err != nil && reason.Reason == contract.ReasonBufferFull:
		w.Header().Set("Retry-After", strconv.Itoa(int(h.cfg.RetryAfter.Seconds())))
		httpapi.WriteJSON(w, http.StatusInsufficientStorage, ack)
	case err != nil && (reason.Reason == contract.ReasonForbidden || reason.Reason == contract.ReasonDeviceKeyRequired):
		httpapi.WriteJSON(w, http.StatusForbidden, ack)
	case err != nil:
		httpapi.WriteJSON(w, http.StatusBadRequest, ack)
	case first:
		httpapi.WriteJSON(w, http.StatusCreated, ack)
	default:
		httpapi.WriteJSON(w, http.StatusOK, ack)
	}
}

// commonHeaders sets the headers of every answer: no content sniffing, no
// framing (nothing this server answers is meant to be embedded).
func commonHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		next.ServeHTTP(w, r)
	})
}

func (h *HTTPServer) readings(w http.ResponseWriter, r *http.Request) {
	sender, body, ok := h.deviceRequest(w, r)
	if !ok {
		return
	}
	batches, err := contract.SplitBatches(body)
	if err != nil {
		h.auditRequest(r, audit.ReasonBadRequest, err.Error())
		httpapi.WriteJSON(w, http.StatusBadRequest, contract.RequestErrorResponse(err.Error()))
		return
	}
	if err := contract.CheckBatchCount(len(batches), h.cfg.MaxBodyBytes); err != nil {
		h.auditRequest(r, audit.ReasonBadRequest, err.Error())
		httpapi.WriteJSON(w, http.StatusBadRequest, contract.RequestErrorResponse(err.Error()))
		return
	}
	payloads := make([][]byte, len(batches))
	for i, b := range batches {
		payloads[i] = b
	}
	results, err := h.ingest.Readings(r.Context(), sender, payloads)
	if errors.Is(err, ingest.ErrShuttingDown) {
		h.unavailable(w, "the gateway is shutting down; retry later")
		return
	}
	if err != nil {
		h.logger.Error("commit failed; nothing acknowledged", "err", err)
	}
	resp := contract.NewReadingsResponse(results)
	code := resp.HTTPStatus()
	if code == http.StatusInsufficientStorage && ingest.OnlyLimited(results) {
		// A device or key past its share: the buffer has room for others.
		code = http.StatusTooManyRequests
	}
	if code == http.StatusInsufficientStorage || code == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", strconv.Itoa(int(h.cfg.RetryAfter.Seconds())))
	}
	httpapi.WriteJSON(w, code, resp)
}

func (h *HTTPServer) unavailable(w http.ResponseWriter, msg string) {
	httpapi.Unavailable(w, h.cfg.RetryAfter, msg)
}

func errorBody(msg string) contract.ReadingsResponse {
	return contract.RequestErrorResponse(msg)
}

// auditRequest records an HTTP request refused as a whole. It never
// records the API key.
func (h *HTTPServer) auditRequest(r *http.Request, reason, msg string) {
	h.ingest.AuditRefusal(audit.Record{Transport: contract.TransportHTTP, Kind: "request", Reason: reason,
		Message: r.Method + " " + r.URL.Path + ": " + msg, RemoteAddr: r.RemoteAddr})
}
