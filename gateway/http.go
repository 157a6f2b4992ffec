package gateway

import (
	"cmp"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"greenhouse-gateway/internal/audit"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/uplink"
)

// HTTPConfig configures the HTTP API.
type HTTPConfig struct {
	// Addr is the TCP listen address. Default ":8080".
	Addr string `yaml:"addr"`
	// MaxBodyBytes is the largest request body accepted; larger ones get
	// 413. Default 1048576 (1 MiB).
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// RetryAfter is the Retry-After sent with 503 and 507 answers.
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

// HTTPDeps are what the HTTP API serves.
type HTTPDeps struct {
	// Ingest and Auth serve the device API (POST /v1/readings and
	// /v1/register); without both it is not served.
	Ingest *Ingest
	Auth   *Authenticator
	// Devices backs the operator endpoints; nil disables them.
	Devices *Registry
	// DeviceKeys shows each device's keys and backs the operator's key
	// reset; nil: no device keys (the reset answers 404).
	DeviceKeys *DeviceKeys
	// History backs the operator's reading queries; nil answers them 404.
	History History
	// DeadLetters backs /v1/dead-letters (the buffer).
	DeadLetters DeadLetterStore
	// AdminToken guards the operator endpoints (Authorization: Bearer, or
	// Basic with the token as password); empty disables them.
	AdminToken string
	// Status feeds the status page (GET /) and GET /v1/status.
	Status StatusSources
	// Uplink reports the uplink's state for GET /v1/uplink (operator API);
	// nil answers 404.
	Uplink func() uplink.Report
	// Metrics serves /metrics.
	Metrics http.Handler
	// Ready reports whether the gateway can take batches (for /readyz).
	Ready func() error
	// Audit backs GET /v1/audit; nil answers 404.
	Audit *audit.Log
	// Registerer takes the connection metrics; nil keeps them private.
	Registerer prometheus.Registerer
}

// HTTPServer serves the device API, the operator API, metrics and health
// endpoints.
type HTTPServer struct {
	cfg      HTTPConfig
	deps     HTTPDeps
	ingest   *Ingest
	auth     *Authenticator
	logger   *slog.Logger
	server   *http.Server
	listener net.Listener
	admit    *admission
	// crossOrigin refuses browsers' cross-site state-changing requests.
	crossOrigin *http.CrossOriginProtection
}

// NewHTTPServer returns the HTTP API; it does not listen yet.
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
		admit: newAdmission(cfg.MaxConns, cfg.MaxConnsPerAddr, logger, reg), crossOrigin: http.NewCrossOriginProtection()}
	mux := http.NewServeMux()
	if deps.Ingest != nil && deps.Auth != nil { // else an operator-only API
		mux.HandleFunc("POST /v1/readings", h.readings)
		mux.HandleFunc("POST /v1/register", h.register)
	}
	mux.HandleFunc("GET /v1/devices", h.admin(h.listDevices))
	mux.HandleFunc("GET /v1/devices/{hardware_id}", h.admin(h.getDevice))
	mux.HandleFunc("GET /v1/devices/{hardware_id}/readings", h.admin(h.deviceReadings))
	mux.HandleFunc("GET /v1/devices/{hardware_id}/summary", h.admin(h.deviceSummary))
	mux.HandleFunc("POST /v1/devices/{hardware_id}/reset-key", h.admin(h.resetKey))
	mux.HandleFunc("GET /v1/status", h.admin(h.statusJSON))
	mux.HandleFunc("GET /{$}", h.statusPage)
	mux.HandleFunc("GET /v1/dead-letters", h.admin(h.listDeadLetters))
	mux.HandleFunc("POST /v1/dead-letters/{batch_id}/reforward", h.admin(h.reforwardDeadLetter))
	mux.HandleFunc("GET /v1/uplink", h.admin(h.uplinkReport))
	mux.HandleFunc("GET /v1/audit", h.admin(h.queryAudit))
	mux.Handle("GET /metrics", deps.Metrics)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := h.deps.Ready(); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "message": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
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

// Listen binds the TCP listener.
func (h *HTTPServer) Listen() error {
	tlsConfig, err := loadTLS(h.cfg.TLSCertFile, h.cfg.TLSKeyFile)
	if err != nil {
		return fmt.Errorf("http TLS: %w", err)
	}
	l, err := net.Listen("tcp", h.cfg.Addr)
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

// apiKey returns the key of "Authorization: Bearer KEY" or "X-API-Key: KEY".
func apiKey(r *http.Request) string {
	if auth := r.Header.Get("Authorization"); auth != "" {
		scheme, key, ok := strings.Cut(auth, " ")
		if ok && strings.EqualFold(scheme, "Bearer") {
			return strings.TrimSpace(key)
		}
		return ""
	}
	return r.Header.Get("X-API-Key")
}

// deviceRequest authenticates a device request and reads its body; it has
// answered the request when ok is false. ctx carries the principal and the
// sender's address to the ingest path.
func (h *HTTPServer) deviceRequest(w http.ResponseWriter, r *http.Request) (ctx context.Context, body []byte, ok bool) {
	if h.ingest.stopping() {
		h.unavailable(w, "the gateway is shutting down; retry later")
		return nil, nil, false
	}
	p, err := h.auth.Identify(r.Context(), apiKey(r))
	switch {
	case errors.Is(err, ErrAuthUnavailable):
		h.ingest.auditRequest(r, audit.ReasonAuthUnavailable, "the API key cannot be verified now")
		h.unavailable(w, "the API key cannot be verified now; retry later")
		return nil, nil, false
	case err != nil:
		h.ingest.auditRequest(r, audit.ReasonUnauthorized, "missing, unknown or revoked API key")
		writeJSON(w, http.StatusUnauthorized, errorBody("missing, unknown or revoked API key (Authorization: Bearer KEY)"))
		return nil, nil, false
	}
	body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		h.ingest.auditRequest(r, audit.ReasonOversize, fmt.Sprintf("body over %d bytes", h.cfg.MaxBodyBytes))
		writeJSON(w, http.StatusRequestEntityTooLarge,
			errorBody(fmt.Sprintf("request body is larger than %d bytes", h.cfg.MaxBodyBytes)))
		return nil, nil, false
	case err != nil:
		writeJSON(w, http.StatusBadRequest, errorBody("reading the request body: "+err.Error()))
		return nil, nil, false
	}
	return withPrincipal(h.ingest.withRemoteAddr(r.Context(), r.RemoteAddr), p), body, true
}

// register answers 201 with the register ack at a device's first
// registration, 200 at the next ones, 400 when invalid, 403 when the key
// may not register this device.
func (h *HTTPServer) register(w http.ResponseWriter, r *http.Request) {
	ctx, body, ok := h.deviceRequest(w, r)
	if !ok {
		return
	}
	ack, first, err := h.ingest.Register(ctx, "", body)
	switch reason := contract.AsError(err); {
	case errors.Is(err, ErrShuttingDown):
		h.unavailable(w, "the gateway is shutting down; retry later")
	case err != nil && reason.Reason == contract.ReasonBufferFull:
		w.Header().Set("Retry-After", strconv.Itoa(int(h.cfg.RetryAfter.Seconds())))
		writeJSON(w, http.StatusInsufficientStorage, ack)
	case err != nil && (reason.Reason == contract.ReasonForbidden || reason.Reason == contract.ReasonDeviceKeyRequired):
		writeJSON(w, http.StatusForbidden, ack)
	case err != nil:
		writeJSON(w, http.StatusBadRequest, ack)
	case first:
		writeJSON(w, http.StatusCreated, ack)
	default:
		writeJSON(w, http.StatusOK, ack)
	}
}

// admin guards an operator endpoint with the admin token. A
// state-changing request (any method but GET and HEAD) must also be
// same-origin or from a non-browser client (http.CrossOriginProtection:
// Sec-Fetch-Site, else Origin against Host), and must present the token in
// a header a browser never adds by itself (Authorization: Bearer or
// X-API-Key): Basic credentials, which a browser resends on its own to any
// page's form posts, are refused for it.
func (h *HTTPServer) admin(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if h.deps.AdminToken == "" || h.deps.Devices == nil {
			writeJSON(w, http.StatusForbidden, map[string]string{"status": "error",
				"message": "the operator API is disabled: set GATEWAY_ADMIN_TOKEN"})
			return
		}
		changing := r.Method != http.MethodGet && r.Method != http.MethodHead
		if changing && !h.sameOriginBearer(w, r) {
			return
		}
		if subtle.ConstantTimeCompare([]byte(adminCredential(r)), []byte(h.deps.AdminToken)) != 1 {
			if changing {
				w.Header().Set("WWW-Authenticate", `Bearer realm="greenhouse-gateway"`)
			} else {
				w.Header().Set("WWW-Authenticate", `Basic realm="greenhouse-gateway"`)
			}
			writeJSON(w, http.StatusUnauthorized, map[string]string{"status": "error",
				"message": "missing or wrong admin token (Authorization: Bearer TOKEN, or Basic with any user name and the token as password)"})
			return
		}
		next(w, r)
	}
}

// sameOriginBearer answers 403 to a state-changing operator request that
// is cross-site or carries Basic credentials, and reports whether it may
// go on.
func (h *HTTPServer) sameOriginBearer(w http.ResponseWriter, r *http.Request) bool {
	if err := h.crossOrigin.Check(r); err != nil {
		adminError(w, http.StatusForbidden, "cross-site request refused: state-changing operator requests must come "+
			"from this gateway's own pages or from a non-browser client ("+err.Error()+")")
		return false
	}
	if _, _, basic := r.BasicAuth(); basic {
		adminError(w, http.StatusForbidden, "Basic credentials refused: state-changing operator requests take "+
			"the admin token as Authorization: Bearer TOKEN")
		return false
	}
	return true
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

// adminCredential returns the admin token a request presents: the
// password of Basic auth (browsers), else the Bearer token or X-API-Key.
func adminCredential(r *http.Request) string {
	if _, password, ok := r.BasicAuth(); ok {
		return password
	}
	return apiKey(r)
}

// deviceView is a device as operators see it: the registry's record and
// its device keys.
type deviceView struct {
	Device
	DeviceKey *DeviceKeyState `json:"device_key,omitempty"`
}

func (h *HTTPServer) view(d Device) deviceView {
	v := deviceView{Device: d}
	if h.deps.DeviceKeys != nil {
		if s, ok := h.deps.DeviceKeys.State(d.HardwareID); ok {
			v.DeviceKey = &s
		}
	}
	return v
}

func (h *HTTPServer) listDevices(w http.ResponseWriter, r *http.Request) {
	devices := h.deps.Devices.Devices()
	views := make([]deviceView, len(devices))
	for i, d := range devices {
		views[i] = h.view(d)
	}
	writeJSON(w, http.StatusOK, map[string]any{"count": len(views), "devices": views})
}

func (h *HTTPServer) getDevice(w http.ResponseWriter, r *http.Request) {
	hw := r.PathValue("hardware_id")
	if err := contract.ValidHardwareID(hw); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"status": "error", "message": err.Error()})
		return
	}
	d, ok := h.deps.Devices.Device(hw)
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"status": "error", "message": "no device " + hw})
		return
	}
	writeJSON(w, http.StatusOK, h.view(d))
}

// resetKeyAnswer is the answer of POST /v1/devices/{hardware_id}/reset-key.
type resetKeyAnswer struct {
	HardwareID string `json:"hardware_id"`
	Status     string `json:"status"`
	// RevokedKeyID is the device key revoked (null when the device had
	// none); RevokedKeyIDs lists them all when it had several (a key an
	// operator created for it besides the one it enrolled with).
	RevokedKeyID  *string  `json:"revoked_key_id"`
	RevokedKeyIDs []string `json:"revoked_key_ids"`
}

// resetKey revokes a device's keys so that it can enroll again: the
// operator's answer to a device that lost its key.
func (h *HTTPServer) resetKey(w http.ResponseWriter, r *http.Request) {
	hw := r.PathValue("hardware_id")
	if err := contract.ValidHardwareID(hw); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"status": "error", "message": err.Error()})
		return
	}
	if h.deps.DeviceKeys == nil {
		writeJSON(w, http.StatusNotFound, map[string]string{"status": "error", "message": errNoDeviceKeys.Error()})
		return
	}
	ids, err := h.deps.DeviceKeys.Reset(hw)
	if err != nil {
		h.logger.Error("device key reset not saved", "hardware_id", hw, "err", err)
		h.unavailable(w, "the reset could not be saved; retry later")
		return
	}
	a := resetKeyAnswer{HardwareID: hw, Status: "reset", RevokedKeyIDs: ids}
	if a.RevokedKeyIDs == nil {
		a.RevokedKeyIDs = []string{}
	}
	if len(ids) > 0 {
		a.RevokedKeyID = &ids[0]
	}
	writeJSON(w, http.StatusOK, a)
}

func (h *HTTPServer) uplinkReport(w http.ResponseWriter, r *http.Request) {
	if h.deps.Uplink == nil {
		writeJSON(w, http.StatusNotFound, map[string]string{"status": "error", "message": "no uplink runs in this gateway"})
		return
	}
	writeJSON(w, http.StatusOK, h.deps.Uplink())
}

func (h *HTTPServer) readings(w http.ResponseWriter, r *http.Request) {
	ctx, body, ok := h.deviceRequest(w, r)
	if !ok {
		return
	}
	batches, err := contract.SplitBatches(body)
	if err != nil {
		h.ingest.auditRequest(r, audit.ReasonBadRequest, err.Error())
		writeJSON(w, http.StatusBadRequest, contract.RequestErrorResponse(err.Error()))
		return
	}
	// No valid batch is shorter than minBatchBytes, so a body with more
	// batches than that allows is refused whole: answering each one costs
	// far more than its bytes (a 1 MiB body of "{}" batches made a 32 MB
	// answer and ~200 MiB of heap).
	if limit := max(1, h.cfg.MaxBodyBytes/minBatchBytes); int64(len(batches)) > limit {
		h.ingest.auditRequest(r, audit.ReasonBadRequest, fmt.Sprintf("%d batches in one request, over %d", len(batches), limit))
		writeJSON(w, http.StatusBadRequest, contract.RequestErrorResponse(fmt.Sprintf(
			"%d batches in one request; a %d-byte body holds at most %d valid ones", len(batches), h.cfg.MaxBodyBytes, limit)))
		return
	}
	payloads := make([][]byte, len(batches))
	for i, b := range batches {
		payloads[i] = b
	}
	results, err := h.ingest.Readings(ctx, TransportHTTP, "", payloads)
	if errors.Is(err, ErrShuttingDown) {
		h.unavailable(w, "the gateway is shutting down; retry later")
		return
	}
	if err != nil {
		h.logger.Error("commit failed; nothing acknowledged", "err", err)
	}
	resp := contract.NewReadingsResponse(results)
	code := resp.HTTPStatus()
	if code == http.StatusInsufficientStorage {
		w.Header().Set("Retry-After", strconv.Itoa(int(h.cfg.RetryAfter.Seconds())))
	}
	writeJSON(w, code, resp)
}

// minBatchBytes is less than the length of the shortest valid batch (183
// bytes).
const minBatchBytes = 128

func (h *HTTPServer) unavailable(w http.ResponseWriter, msg string) {
	w.Header().Set("Retry-After", strconv.Itoa(int(h.cfg.RetryAfter.Seconds())))
	writeJSON(w, http.StatusServiceUnavailable, errorBody(msg))
}

func errorBody(msg string) contract.ReadingsResponse {
	return contract.RequestErrorResponse(msg)
}

// loadTLS returns the TLS configuration of a listener, or nil without
// certificate.
func loadTLS(certFile, keyFile string) (*tls.Config, error) {
	if certFile == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("loading %s and %s: %w", certFile, keyFile, err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
