package broker

import (
	"fmt"

	mqtt "github.com/mochi-mqtt/server/v2"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/gateway/auth"
	"greenhouse-gateway/internal/audit"
)

// auditMQTT records a refused MQTT connection, publish or subscription. It
// never records the password.
func (b *Broker) auditMQTT(cl *mqtt.Client, kind, hw, reason, topic, msg string) {
	b.ingest.AuditRefusal(audit.Record{Transport: contract.TransportMQTT, Kind: kind, HardwareID: hw,
		Reason: reason, Topic: topic, Message: msg, RemoteAddr: cl.Net.Remote})
}

// auditConnectRefusal records a CONNECT the broker refused, for the
// reason it counts in gateway_mqtt_connections_refused_total.
func (b *Broker) auditConnectRefusal(cl *mqtt.Client, hw, refused, willTopic string) {
	reason, topic, msg := audit.ReasonUnauthorized, "", "unknown or revoked API key"
	switch refused {
	case "bad_identity":
		if contract.ValidHardwareID(hw) != nil {
			reason, msg = audit.ReasonBadIdentity, "user name is not a hardware_id"
		} else {
			reason, msg = audit.ReasonClientIDRefused, fmt.Sprintf("client ID %q is not the device's hardware_id "+
				"(or hardware_id-suffix)", truncateString(cl.ID, 128))
		}
	case "bad_will":
		reason, topic, msg = audit.ReasonACLDenied, willTopic, "will on a topic the device may not publish to"
	case "unavailable":
		reason, msg = audit.ReasonAuthUnavailable, "the API key cannot be verified now"
	case reasonMaxClients:
		reason, msg = audit.ReasonQuotaExceeded, "every client slot (mqtt.max_clients) is taken"
	case reasonDeviceSessions:
		reason, msg = audit.ReasonQuotaExceeded, "the device's connected client IDs are at mqtt.max_sessions_per_device"
	case reasonKeyShare:
		reason, msg = audit.ReasonQuotaExceeded, "the API key's connections are at its share of mqtt.max_clients "+
			"(mqtt.max_clients_per_key_percent)"
	}
	b.auditMQTT(cl, "connect", hw, reason, topic, msg)
}

// auditACLDenial records a publish or subscription on a topic the device
// may not use.
func (b *Broker) auditACLDenial(cl *mqtt.Client, hw, topic string, write bool) {
	kind, msg := "subscribe", "subscription to a topic other than the device's own ack topic"
	if write {
		kind, msg = "publish", "publish to a topic other than the device's own readings and register topics; disconnected"
	}
	b.auditMQTT(cl, kind, hw, audit.ReasonACLDenied, topic, msg)
}

// takeover records a connection taking over the connected session of its
// client ID: in the audit trail, per device in the registry, and in
// gateway_mqtt_session_takeovers_total.
func (b *Broker) takeover(cl, old *mqtt.Client, hw string, p auth.Principal) {
	b.takeovers.WithLabelValues(p.Kind()).Inc()
	msg := fmt.Sprintf("client ID %s taken over with a %s key (key_id %s) from %s", truncateString(cl.ID, 128), p.Kind(),
		p.KeyID, old.Net.Remote)
	b.auditMQTT(cl, "connect", hw, audit.ReasonSessionTakeover, "", msg)
	if n, flagged := b.ingest.Takeover(hw); flagged {
		b.logger.Warn("repeated session takeovers of one device: another client may be impersonating it",
			"hardware_id", hw, "takeovers_last_hour", n, "key_id", p.KeyID, "key", p.Kind(), "remote", cl.Net.Remote,
			"previous_remote", old.Net.Remote)
	}
}

func truncateString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
