// Package gateway is the daemon as one assembly: it owns the wiring of
// every part (the device keys and the authenticator, the device registry,
// the audit trail, the ingest path, the MQTT side, the uplink, the
// operator API and the HTTP listener) and the order they start and stop
// in. New builds them all from a Config and Deps, with no I/O and nothing
// set afterwards; Run loads what they keep, binds the listeners, runs them
// and, when its context is done or a part fails, stops them in the order
// the steps type documents, the buffer last; Close releases what Run
// opened when it never ran every part. cmd/gatewayd and the in-process
// test gateway (harness/gatewaytest) are both built by New.
//
// The LAN side lives in the packages below, one concern each:
// gateway/ingest (the ingest path), gateway/broker (the embedded MQTT
// broker), gateway/bridge (the external-broker consumer),
// gateway/httpserve (the HTTP listener) and gateway/auth (API keys and
// device keys). A batch from a socket to DynamoDB passes through them in
// that order: a transport (broker, bridge or httpserve, after auth) hands
// it to ingest, which commits it to the buffer; the uplink forwards it.
package gateway
