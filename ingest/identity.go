package ingest

import (
	"context"
	"fmt"

	mqtt "github.com/mochi-mqtt/server/v2"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/audit"
)

// principalKey carries the Principal of a device request in its context.
type principalKey struct{}

// withPrincipal tells the ingest path who sent a message (the embedded
// broker and the HTTP API; an external broker authenticates devices
// itself, and its messages carry none).
func withPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

func principalFrom(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// SetDeviceKeys gives the ingest path the device keys: it authorizes each
// message's principal for its hardware_id and enrolls devices registering
// with a fleet key. Without them a device key still acts for its own
// device only.
func (in *Ingest) SetDeviceKeys(k *DeviceKeys) { in.keys = k }

// authorize decides whether p may act for hw; a refusal is logged (one
// line a minute at most, with the count of the others).
func (in *Ingest) authorize(p Principal, hw, action, transport string) *contract.Error {
	var err *contract.Error
	switch {
	case in.keys != nil:
		err = in.keys.Authorize(p, hw, action, transport)
	case p.Bound() && p.HardwareID != hw:
		err = identityError(contract.ReasonForbidden,
			fmt.Sprintf("the API key is bound to %s; it cannot act for %s", p.HardwareID, hw))
	}
	if err != nil {
		if counts := in.identityLog.add(string(err.Reason)); counts != nil {
			in.logger.Warn("device refused for its identity: "+err.Rule, "reason", err.Reason, "transport", transport,
				"action", action, "hardware_id", hw, "key_id", p.KeyID, "key", p.Kind(),
				"refusals_since_last_line", counts)
		}
	}
	return err
}

// authorizeCtx authorizes the principal of ctx, if any, for hw.
func (in *Ingest) authorizeCtx(ctx context.Context, hw, action, transport string) *contract.Error {
	p, ok := principalFrom(ctx)
	if !ok {
		return nil
	}
	return in.authorize(p, hw, action, transport)
}

// enroll issues a device registering with a fleet key its device key, into
// the register ack, when the policy says so. A key that could not be saved
// is not issued: the device gets one at its next registration.
func (in *Ingest) enroll(ctx context.Context, hw string, ack *contract.Ack) {
	p, ok := principalFrom(ctx)
	if !ok || p.Bound() || in.keys == nil {
		return
	}
	raw, keyID, err := in.keys.Enroll(hw)
	if err != nil {
		in.logger.Error("device key not issued; the device gets one at its next registration", "hardware_id", hw, "err", err)
		return
	}
	ack.DeviceKey, ack.DeviceKeyID = raw, keyID
}

// takeover records a connection taking over the connected session of its
// client ID: in the audit trail, per device in the registry, and in
// gateway_mqtt_session_takeovers_total.
func (b *Broker) takeover(cl, old *mqtt.Client, hw string, p Principal) {
	b.takeovers.WithLabelValues(p.Kind()).Inc()
	msg := fmt.Sprintf("client ID %s taken over with a %s key (key_id %s) from %s", truncateString(cl.ID, 128), p.Kind(),
		p.KeyID, old.Net.Remote)
	b.ingest.auditMQTT(cl, "connect", hw, audit.ReasonSessionTakeover, "", msg)
	if b.ingest.devices == nil {
		return
	}
	if n, flagged := b.ingest.devices.Takeover(hw); flagged {
		b.logger.Warn("repeated session takeovers of one device: another client may be impersonating it",
			"hardware_id", hw, "takeovers_last_hour", n, "key_id", p.KeyID, "key", p.Kind(), "remote", cl.Net.Remote,
			"previous_remote", old.Net.Remote)
	}
}
