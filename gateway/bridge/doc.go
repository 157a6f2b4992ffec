// Package bridge is the gateway's consumer of an external MQTT broker
// (mqtt.mode: external, paho): it owns the connection to that broker, its
// subscriptions (shared or not), the per-device queues that keep each
// device's messages in order, the ack publishes, and the rule that a
// message is acknowledged to the broker only once the ingest path allows
// it, so that the broker redelivers what was not stored.
//
// NewExternal connects nothing; Run connects, reconnects with backoff and
// serves until its context is done.
//
// Imports: gateway/ingest (where messages go) and firmware-contract.
package bridge
