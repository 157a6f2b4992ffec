package uplink

import (
	"context"
	"fmt"

	"greenhouse-gateway/internal/cloud"
)

// DeviceSource holds device records waiting to be written (the device
// registry, registry.Registry). They are durable there until Upserted is called.
type DeviceSource interface {
	PendingUpserts(limit int) []cloud.DeviceUpsert
	Upserted(cloud.DeviceUpsert)
}

// upsertDevices writes the pending device records and returns how many it
// wrote.
func (u *Uplink) upsertDevices(ctx context.Context) (int, error) {
	if u.devices == nil {
		return 0, nil
	}
	pending := u.devices.PendingUpserts(100)
	for i, d := range pending {
		err := u.call(ctx, "UpdateItem", func(ctx context.Context) error {
			_, err := u.db.UpdateItem(ctx, cloud.DeviceUpdate(u.tables, d))
			return err
		})
		if err != nil {
			return i, fmt.Errorf("UpdateItem for device %s: %w", d.HardwareID, err)
		}
		u.devices.Upserted(d)
		u.metrics.deviceUpserts.Inc()
	}
	return len(pending), nil
}
