package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime/debug"
	"time"
)

// envMemLimit is the Go runtime's own soft memory limit variable.
const envMemLimit = "GOMEMLIMIT"

// defaultMemoryLimit is memory_limit's default: 192 MiB, three quarters of
// the systemd unit's MemoryMax=256M.
const defaultMemoryLimit = 192 << 20

// DebugConfig configures the diagnostics endpoints.
type DebugConfig struct {
	// PprofAddr, when set, serves Go's profiles (net/http/pprof) under
	// /debug/pprof/ on this address, without authentication: keep it on
	// loopback (127.0.0.1:6060). Default empty: off.
	PprofAddr string `yaml:"pprof_addr"`
}

// Validate reports the first invalid field.
func (c DebugConfig) Validate() error {
	if c.PprofAddr == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(c.PprofAddr); err != nil {
		return fmt.Errorf("debug.pprof_addr: %q is not host:port: %w", c.PprofAddr, err)
	}
	return nil
}

// validateMemoryLimit checks the memory_limit setting.
func validateMemoryLimit(limit int64) error {
	if limit != 0 && limit < 32<<20 {
		return fmt.Errorf("memory_limit: %d is below 32 MiB (0 turns the limit off)", limit)
	}
	return nil
}

// applyMemoryLimit sets the Go runtime's soft memory limit to limit bytes
// unless the environment sets GOMEMLIMIT (the runtime applied that one at
// start, and it wins) or limit is 0. It returns the limit in force and
// where it comes from.
func applyMemoryLimit(limit int64, environ []string) (int64, string) {
	if lookupEnv(environ, envMemLimit) != "" {
		return debug.SetMemoryLimit(-1), envMemLimit
	}
	if limit == 0 {
		return debug.SetMemoryLimit(-1), "none"
	}
	debug.SetMemoryLimit(limit)
	return limit, "memory_limit"
}

// pprofServer serves net/http/pprof on its own listener.
type pprofServer struct {
	srv *http.Server
	ln  net.Listener
}

// listenPprof binds addr and returns the server, or nil when addr is empty.
func listenPprof(addr string, logger *slog.Logger) (*pprofServer, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for pprof on %s: %w", addr, err)
	}
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && !tcp.IP.IsLoopback() {
		logger.Warn("debug.pprof_addr is not a loopback address: anyone who reaches it can read the gateway's memory profiles",
			"addr", ln.Addr().String())
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	logger.Info("pprof serving", "addr", ln.Addr().String())
	return &pprofServer{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}}, nil
}

// close releases the listener of a server that never ran.
func (p *pprofServer) close() {
	if p != nil {
		_ = p.ln.Close()
	}
}

// Run serves until ctx is done.
func (p *pprofServer) Run(ctx context.Context) error {
	if p == nil {
		return nil
	}
	errc := make(chan error, 1)
	go func() { errc <- p.srv.Serve(p.ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serving pprof: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := p.srv.Shutdown(sctx); err != nil {
		_ = p.srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving pprof: %w", err)
	}
	return nil
}
