package ingest

import (
	"context"
	"fmt"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/gateway/auth"
)

// principalKey carries the Principal of a device request in its context.
type principalKey struct{}

// withPrincipal carries who sent a message (Sender.Principal) in ctx.
func withPrincipal(ctx context.Context, p auth.Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

func principalFrom(ctx context.Context) (auth.Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(auth.Principal)
	return p, ok
}

// Authorize decides whether p may act for hw (auth.ActConnect,
// auth.ActRegister or auth.ActReadings); a refusal is logged (one line a
// minute at most, with the count of the others).
func (in *Ingest) Authorize(p auth.Principal, hw, action, transport string) *contract.Error {
	var err *contract.Error
	switch {
	case in.keys != nil:
		err = in.keys.Authorize(p, hw, action, transport)
	case p.Bound() && p.HardwareID != hw:
		err = auth.IdentityError(contract.ReasonForbidden,
			fmt.Sprintf("the API key is bound to %s; it cannot act for %s", p.HardwareID, hw))
	}
	if err != nil {
		if counts := in.identityLog.Add(string(err.Reason)); counts != nil {
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
	return in.Authorize(p, hw, action, transport)
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

// Takeover tells the registry that a connection took over the connected
// session of hw's client ID. It returns the device's takeovers in the last
// hour and whether they are many enough to flag (false without a
// registry).
func (in *Ingest) Takeover(hw string) (n int, flagged bool) {
	if in.devices == nil {
		return 0, false
	}
	return in.devices.Takeover(hw)
}
