package ingest

import (
	"time"
)

// HTTPTimeouts returns the HTTP server's read header, read, write and idle
// timeouts.
func HTTPTimeouts(h *HTTPServer) [4]time.Duration {
	s := h.server
	return [4]time.Duration{s.ReadHeaderTimeout, s.ReadTimeout, s.WriteTimeout, s.IdleTimeout}
}

// HTTPConfigWithDefaults returns c with its defaults filled in.
func HTTPConfigWithDefaults(c HTTPConfig) HTTPConfig { return c.withDefaults() }
