package httpserve

import (
	"net/http"
	"time"
)

// Test hooks for the tests of package httpserve_test: they read or change
// unexported fields, before Run when they change them.

// HTTPHandler returns the API's handler, to serve requests without a
// listener.
func HTTPHandler(h *HTTPServer) http.Handler { return h.server.Handler }

// HTTPTimeouts returns the HTTP server's read header, read, write and idle
// timeouts.
func HTTPTimeouts(h *HTTPServer) [4]time.Duration {
	s := h.server
	return [4]time.Duration{s.ReadHeaderTimeout, s.ReadTimeout, s.WriteTimeout, s.IdleTimeout}
}

// HTTPConfigWithDefaults returns c with its defaults filled in.
func HTTPConfigWithDefaults(c HTTPConfig) HTTPConfig { return c.withDefaults() }
