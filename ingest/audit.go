package ingest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	mqtt "github.com/mochi-mqtt/server/v2"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/audit"
)

// SetAudit makes the ingest path, and the MQTT broker and HTTP API built
// on it, record every attempt they refuse or do not store in log. Call it
// before serving; without it (or with nil) nothing is recorded.
func (in *Ingest) SetAudit(log *audit.Log) { in.audit = log }

type remoteAddrKey struct{}

// withRemoteAddr tells the ingest path the sender's address, for the audit
// trail; it does nothing while no audit trail is set.
func (in *Ingest) withRemoteAddr(ctx context.Context, addr string) context.Context {
	if in.audit == nil {
		return ctx
	}
	return context.WithValue(ctx, remoteAddrKey{}, addr)
}

func remoteAddr(ctx context.Context) string {
	s, _ := ctx.Value(remoteAddrKey{}).(string)
	return s
}

// auditBatch records a batch that was not stored: rejected, or a
// duplicate. hw is the hardware_id known so far ("" when the batch could
// not be decoded: the claim is then looked for in the payload).
func (in *Ingest) auditBatch(ctx context.Context, transport, hw string, payload []byte, r contract.Result, err error) {
	if in.audit == nil || r.Status == contract.StatusAccepted {
		return
	}
	rec := audit.Record{Time: in.clock.Now(), Transport: transport, Kind: contract.KindReadings, HardwareID: hw,
		BatchID: r.BatchID, RemoteAddr: remoteAddr(ctx)}
	if rec.HardwareID == "" {
		rec.HardwareID = claimedHardwareID(payload)
	}
	if r.Status == contract.StatusDuplicate {
		rec.Reason, rec.Message = audit.ReasonDuplicate, "batch already stored; not stored again"
	} else {
		rec.Reason = string(*r.Reason)
		rec.Message = *r.Message
	}
	if ce := contract.AsError(err); ce != nil {
		rec.Field, rec.Message = ce.Field, ce.Rule
	}
	in.audit.Record(rec)
}

// auditRegister records a refused registration.
func (in *Ingest) auditRegister(ctx context.Context, sender string, payload []byte, err error) {
	if in.audit == nil {
		return
	}
	ce := contract.AsError(err)
	rec := audit.Record{Time: in.clock.Now(), Transport: contract.TransportMQTT, Kind: contract.KindRegister, HardwareID: sender,
		Reason: string(ce.Reason), Field: ce.Field, Message: ce.Rule, RemoteAddr: remoteAddr(ctx)}
	if sender == "" {
		rec.Transport, rec.HardwareID = contract.TransportHTTP, claimedHardwareID(payload)
	}
	in.audit.Record(rec)
}

// auditRequest records an HTTP request refused as a whole. It never
// records the API key.
func (in *Ingest) auditRequest(r *http.Request, reason, msg string) {
	if in.audit == nil {
		return
	}
	in.audit.Record(audit.Record{Time: in.clock.Now(), Transport: contract.TransportHTTP, Kind: "request", Reason: reason,
		Message: r.Method + " " + r.URL.Path + ": " + msg, RemoteAddr: r.RemoteAddr})
}

// auditMQTT records a refused MQTT connection, publish or subscription. It
// never records the password.
func (in *Ingest) auditMQTT(cl *mqtt.Client, kind, hw, reason, topic, msg string) {
	if in.audit == nil {
		return
	}
	in.audit.Record(audit.Record{Time: in.clock.Now(), Transport: contract.TransportMQTT, Kind: kind, HardwareID: hw,
		Reason: reason, Topic: topic, Message: msg, RemoteAddr: cl.Net.Remote})
}

// auditConnectRefusal records a CONNECT the broker refused, for the
// reason it counts in gateway_mqtt_connections_refused_total.
func (in *Ingest) auditConnectRefusal(cl *mqtt.Client, hw, refused, willTopic string) {
	if in.audit == nil {
		return
	}
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
	in.auditMQTT(cl, "connect", hw, reason, topic, msg)
}

func truncateString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// claimedHardwareID returns the hardware_id member of a payload that
// failed to decode, or "".
func claimedHardwareID(payload []byte) string {
	var claim struct {
		HardwareID any `json:"hardware_id"`
	}
	_ = json.Unmarshal(payload, &claim) // best effort: a type error elsewhere still fills it
	s, _ := claim.HardwareID.(string)
	return s
}

// auditACLDenial records a publish or subscription on a topic the device
// may not use.
func (in *Ingest) auditACLDenial(cl *mqtt.Client, hw, topic string, write bool) {
	kind, msg := "subscribe", "subscription to a topic other than the device's own ack topic"
	if write {
		kind, msg = "publish", "publish to a topic other than the device's own readings and register topics; disconnected"
	}
	in.auditMQTT(cl, kind, hw, audit.ReasonACLDenied, topic, msg)
}
