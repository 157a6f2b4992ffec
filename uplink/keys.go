package uplink

import (
	"context"
	"time"

	"greenhouse-gateway/internal/cloud"
)

// KeySource holds device keys waiting to be written (the gateway's device
// keys). They are durable there until KeyWritten is called.
type KeySource interface {
	PendingKeyWrites(limit int) []cloud.KeyWrite
	KeyWritten(cloud.KeyWrite)
}

// KeyWriter writes device keys to api_keys (cloud.Keys). Both writes are
// idempotent.
type KeyWriter interface {
	PutDeviceKey(ctx context.Context, info cloud.KeyInfo) error
	RevokeDeviceKey(ctx context.Context, info cloud.KeyInfo) error
}

// SetKeys makes the uplink write src's device keys through w. Call it
// before Run.
func (u *Uplink) SetKeys(src KeySource, w KeyWriter) {
	u.keys, u.keyWriter = src, w
}

// keyLogInterval is the least time between two log lines about device
// keys that could not be written.
const keyLogInterval = time.Minute

// writeKeys writes the pending device keys. A key that cannot be written
// is tried again next round; it does not hold back the readings, so the
// round goes on either way.
func (u *Uplink) writeKeys(ctx context.Context) {
	if u.keys == nil || u.keyWriter == nil {
		return
	}
	for _, w := range u.keys.PendingKeyWrites(25) {
		op, write := "UpdateItem", u.keyWriter.PutDeviceKey
		if w.Revoked {
			op, write = "UpdateItem", u.keyWriter.RevokeDeviceKey
		}
		err := u.call(ctx, op, func(ctx context.Context) error { return write(ctx, w.Key) })
		if err != nil {
			u.keyWarning(w, err)
			return
		}
		u.keys.KeyWritten(w)
		u.metrics.keyWrites.WithLabelValues(map[bool]string{false: "issued", true: "revoked"}[w.Revoked]).Inc()
	}
}

// keyWarning logs that w could not be written, at most once per
// keyLogInterval.
func (u *Uplink) keyWarning(w cloud.KeyWrite, err error) {
	if now := time.Now(); now.Sub(u.keyLoggedAt) >= keyLogInterval {
		u.keyLoggedAt = now
		u.logger.Warn("a device key could not be written to api_keys; trying again", "hardware_id",
			w.Key.HardwareID, "key_id", w.Key.KeyID, "revoke", w.Revoked, "err", err)
	}
}
