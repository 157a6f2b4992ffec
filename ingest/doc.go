// Package ingest is the device-facing side of the gateway: the embedded
// MQTT broker (mqtt*.go, sessions.go: admission, protocol conformance, the
// pre-CONNECT guard, client slots, offline sessions) or the consumer of an
// external broker (external.go), and the HTTP server with the device API
// (http.go, httpadmit.go: POST /v1/readings and /v1/register, connection
// admission, TLS, common headers). Both transports feed one ingest path
// (ingest.go) that decodes, validates, deduplicates and durably commits
// reading batches before any acknowledgement leaves. It also owns API key
// verification (auth.go), device keys and enrollment (devicekeys.go,
// identity.go), and the recording of refused attempts in the audit trail
// (audit.go).
//
// The HTTP server holds the one listener of the gateway's HTTP API: the
// operator routes are mounted on it by the caller (HTTPDeps.Routes).
//
// Every part has the same shape: its New function starts nothing and
// opens no connection (the authenticator and the device keys read their
// saved records from the buffer, which is already open). The Broker and the
// HTTPServer bind their listener in Listen, their start, serve in Run until
// its context is done, and Close a listener that was never served; the
// External consumer connects in Run; the Authenticator's Run writes the
// keys' last uses to api_keys; Ingest.Close refuses new batches and waits
// for the commits in flight.
//
// Imports: buffer (the store it commits to), registry (the devices it
// tells about batches and registrations), firmware-contract and internal/
// (audit, clock, cloud, httpapi). It must not import operator or uplink.
package ingest
