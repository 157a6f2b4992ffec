// Package operator is the gateway's operator surface: the status page and
// its JSON twin (status.go, status.html), the operator API behind the
// admin token (api.go: device list and records, key resets, the uplink
// report, same-origin checks for state-changing requests), reading queries
// and summaries (query.go, answered by internal/readquery, as the cloud's
// read API answers them), dead letters (deadletters.go) and
// audit queries (audit.go). API.Routes mounts it on the HTTP server that
// ingest runs, so both share one listener.
//
// Imports: buffer (dead letters, reading history, disk space), registry
// (the devices it lists), firmware-contract and internal/ (audit, delivery,
// httpapi). It must not import ingest or uplink: the key reset goes through
// the DeviceKeys interface defined here, and the uplink's state arrives as
// a func returning a delivery report.
package operator
