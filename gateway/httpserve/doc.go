// Package httpserve is the gateway's one HTTP listener: it owns the
// listener, its connection admission (httpadmit.go), TLS and timeouts, the
// common headers, the device API (POST /v1/readings and /v1/register,
// which it hands to the ingest path), and it mounts the operator routes
// (HTTPDeps.Routes), /metrics (HTTPDeps.Metrics) and the health endpoints
// on the same mux.
//
// NewHTTPServer starts nothing; Listen binds the listener, Run serves until
// its context is done, and Close releases a listener that was never served.
//
// Imports: gateway/ingest, gateway/auth, gateway/internal/,
// firmware-contract and internal/ (audit, httpapi). It must not import
// operator: the operator routes are handed in.
package httpserve
