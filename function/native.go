package function

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/tablewrite"
)

// HandleBatches answers a native batch event: one result per id of its
// items, devices and keys. Device records and keys are written first, so
// that a batch's device exists when its readings land.
func (f *Function) HandleBatches(ctx context.Context, ev BatchEvent) (BatchResponse, error) {
	if ev.V != EventVersion {
		return BatchResponse{}, fmt.Errorf("gateway_batches event: v %d is not %d", ev.V, EventVersion)
	}
	observed(ctx).gatewayEvent(ev)
	resp := BatchResponse{V: EventVersion, Results: make([]ItemResult, 0, len(ev.Items)+len(ev.Devices)+len(ev.Keys))}
	var extra []ItemResult
	for _, d := range ev.Devices {
		extra = append(extra, writeResult(d.ID, f.upsertDevice(ctx, d.Upsert)))
	}
	for _, k := range ev.Keys {
		extra = append(extra, writeResult(k.ID, f.writeKey(ctx, k.Write)))
	}
	jobs := make([]*job, len(ev.Items))
	for i, it := range ev.Items {
		jobs[i] = newJob(f.decodeBuffered(it.Batch))
	}
	f.store(ctx, jobs, hints(ev.History))
	observed(ctx).jobs(jobs)
	observed(ctx).writes(extra)
	for i, j := range jobs {
		resp.Results = append(resp.Results, itemResult(ev.Items[i].ID, j))
	}
	resp.Results = append(resp.Results, extra...)
	return resp, nil
}

// decodeBuffered decodes a batch as a gateway buffered it: the device's
// JSON, with readings whose clock the gateway repaired marked
// time_source "gateway"; it checks every rule but the clock skew, since
// the gateway may forward a batch long after it was received.
func (f *Function) decodeBuffered(raw json.RawMessage) (*contract.Batch, error) {
	var b contract.Batch
	if err := json.Unmarshal(raw, &b); err != nil {
		return nil, contract.NewError(contract.ReasonValidation, "batch", "must be one device batch object: "+err.Error())
	}
	if err := b.Validate(f.cfg.Limits, time.Time{}); err != nil {
		return &b, err
	}
	return &b, nil
}

// itemResult is a batch's result in a BatchResponse.
func itemResult(id string, j *job) ItemResult {
	r := ItemResult{ID: id, Status: j.outcome.String()}
	switch j.outcome {
	case tablewrite.Delivered:
		r.Quality = j.quality
	case tablewrite.Duplicate:
	case tablewrite.Conflict, tablewrite.Rejected:
		e := contract.AsError(j.err)
		r.Reason, r.Message = string(e.Reason), e.Error()
	case tablewrite.Throttled:
		r.Reason, r.Message = "throttled", j.err.Error()
	case tablewrite.Failed:
		r.Reason, r.Message = "dynamodb", j.err.Error()
		var refused *tablewrite.RequestRefusedError
		switch {
		case errors.Is(j.err, tablewrite.ErrHeldBack):
			r.Reason = "not_attempted"
		case errors.As(j.err, &refused):
			r.Reason = "request_refused"
		}
	}
	return r
}

// writeResult is a device or key write's result in a BatchResponse.
func writeResult(id string, err error) ItemResult {
	switch {
	case err == nil:
		return ItemResult{ID: id, Status: StatusDelivered}
	case tablewrite.Throttling(err):
		return ItemResult{ID: id, Status: StatusThrottled, Reason: "throttled", Message: err.Error()}
	}
	return ItemResult{ID: id, Status: StatusError, Reason: "dynamodb", Message: err.Error()}
}

// upsertDevice writes one device record.
func (f *Function) upsertDevice(ctx context.Context, d cloud.DeviceUpsert) error {
	if d.HardwareID == "" {
		return errors.New("upsert.HardwareID: must be set")
	}
	if _, err := f.db.UpdateItem(ctx, cloud.DeviceUpdate(f.cfg.Tables, d)); err != nil {
		return fmt.Errorf("UpdateItem for device %s: %w", d.HardwareID, err)
	}
	return nil
}

// writeKey writes one device key: issued, or revoked.
func (f *Function) writeKey(ctx context.Context, w cloud.KeyWrite) error {
	if w.Revoked {
		return f.keys.RevokeDeviceKey(ctx, w.Key)
	}
	return f.keys.PutDeviceKey(ctx, w.Key)
}
