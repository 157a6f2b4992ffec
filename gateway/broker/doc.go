// Package broker is the gateway's embedded MQTT broker (mochi-mqtt): it
// owns the MQTT listener and everything about MQTT connections before the
// ingest path sees a message — the pre-CONNECT guard and connection
// admission (mqttguard.go, mqttadmission.go), protocol conformance
// (mqttconform.go), authentication and topic access, client slots per
// device and key (mqttslots.go), offline sessions and queued acks
// (sessions.go), and the answer pipeline that publishes acks in order
// behind their commits (mqttpipe.go). It also holds MQTTConfig, the
// mqtt: settings, including those of the external mode (gateway/bridge).
//
// NewBroker starts nothing; Listen binds the listener, Run serves until
// its context is done, and Close releases a listener that was never served.
//
// Imports: gateway/ingest (where messages go), gateway/auth (API keys),
// gateway/bridge (the external mode's settings), gateway/internal/,
// firmware-contract and internal/audit.
package broker
