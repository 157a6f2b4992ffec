package ingest

import (
	"context"
	"encoding/json"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/audit"
)

type remoteAddrKey struct{}

// withRemoteAddr carries the sender's address in ctx, for the audit
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

// AuditRefusal records a refused connection, request, publish or
// subscription that a transport decided on (rec.Time is set here). It does
// nothing while no audit trail is set; a transport never puts a password or
// API key in rec.
func (in *Ingest) AuditRefusal(rec audit.Record) {
	if in.audit == nil {
		return
	}
	rec.Time = in.clock.Now()
	in.audit.Record(rec)
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
