package gateway

import (
	"context"
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

	"greenhouse-gateway/internal/contract"
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
}

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
	return c
}

// Validate reports the first invalid field.
func (c HTTPConfig) Validate() error {
	if c.MaxBodyBytes < 0 {
		return errors.New("http.max_body_bytes: must not be negative")
	}
	if c.RetryAfter < 0 {
		return errors.New("http.retry_after: must not be negative")
	}
	return nil
}

// HTTPServer serves the device API, metrics and health endpoints.
type HTTPServer struct {
	cfg      HTTPConfig
	ingest   *Ingest
	auth     *Authenticator
	ready    func() error
	logger   *slog.Logger
	server   *http.Server
	listener net.Listener
}

// NewHTTPServer returns the HTTP API. metrics serves /metrics; ready
// reports whether the gateway can take batches (for /readyz).
func NewHTTPServer(cfg HTTPConfig, ingest *Ingest, auth *Authenticator, metrics http.Handler, ready func() error, logger *slog.Logger) (*HTTPServer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	h := &HTTPServer{cfg: cfg.withDefaults(), ingest: ingest, auth: auth, ready: ready,
		logger: logger.With("component", "http")}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/readings", h.readings)
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := h.ready(); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "message": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	h.server = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelDebug),
	}
	return h, nil
}

// Listen binds the TCP listener.
func (h *HTTPServer) Listen() error {
	l, err := net.Listen("tcp", h.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listening for HTTP on %s: %w", h.cfg.Addr, err)
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

func (h *HTTPServer) readings(w http.ResponseWriter, r *http.Request) {
	if h.ingest.stopping() {
		h.unavailable(w, "the gateway is shutting down; retry later")
		return
	}
	switch err := h.auth.Verify(r.Context(), apiKey(r)); {
	case errors.Is(err, ErrAuthUnavailable):
		h.unavailable(w, "the API key cannot be verified now; retry later")
		return
	case err != nil:
		writeJSON(w, http.StatusUnauthorized, errorBody("missing, unknown or revoked API key (Authorization: Bearer KEY)"))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		writeJSON(w, http.StatusRequestEntityTooLarge,
			errorBody(fmt.Sprintf("request body is larger than %d bytes", h.cfg.MaxBodyBytes)))
		return
	case err != nil:
		writeJSON(w, http.StatusBadRequest, errorBody("reading the request body: "+err.Error()))
		return
	}
	batches, err := contract.SplitBatches(body)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, contract.RequestErrorResponse(err.Error()))
		return
	}
	payloads := make([][]byte, len(batches))
	for i, b := range batches {
		payloads[i] = b
	}
	results, err := h.ingest.Readings(r.Context(), TransportHTTP, "", payloads)
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

func (h *HTTPServer) unavailable(w http.ResponseWriter, msg string) {
	w.Header().Set("Retry-After", strconv.Itoa(int(h.cfg.RetryAfter.Seconds())))
	writeJSON(w, http.StatusServiceUnavailable, errorBody(msg))
}

func errorBody(msg string) contract.ReadingsResponse {
	return contract.RequestErrorResponse(msg)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
