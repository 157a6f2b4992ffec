// Package ingest is the gateway's one ingest path, behind every transport:
// it owns decoding and validating reading batches and registrations, the
// identity checks of who sent them (device keys, enrollment), the registry's
// rules (unknown devices, clock repair, ordering), deduplication, the
// durable commit before any acknowledgement, the acknowledgement itself, and
// the audit records of what it refuses.
//
// Transports (the embedded broker in gateway/broker, the external-broker
// bridge in gateway/bridge, the HTTP listener in gateway/httpserve) decode
// their own protocol and hand this package a decoded message: its Sender
// (the topic's hardware_id or none, the remote address, the verified
// principal), its kind and its payload. They get back the ack to send and
// whether the message may be acknowledged at the protocol level. Refusals
// that only a transport sees (a CONNECT, an HTTP request) are recorded
// through AuditRefusal. No MQTT or HTTP type appears here.
//
// New starts nothing and opens nothing; Close refuses new batches and waits
// for the commits in flight.
//
// Imports: buffer (the store it commits to), registry (the devices it tells
// about batches and registrations), gateway/auth (principals, device keys),
// firmware-contract and internal/ (audit, clock). It must not import a
// transport, operator or uplink.
package ingest
