package uplink

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/cloud"
)

// DeviceSource holds device records waiting to be written (the device
// registry, registry.Registry). They are durable there until Upserted is called.
type DeviceSource interface {
	PendingUpserts(limit int) []cloud.DeviceUpsert
	Upserted(cloud.DeviceUpsert)
}

// deviceUpdate is the devices table upsert of schema 002: every attribute
// set, except first_registered_at, which is kept once written.
const deviceUpdate = "SET confirmation_id = :cid, capabilities = :caps, last_seen_at = :seen, " +
	"last_boot_id = :boot, firmware_version = :fw, gsi1pk = :pk, gsi1sk = :seen, " +
	"first_registered_at = if_not_exists(first_registered_at, :first)"

// upsertDevices writes the pending device records and returns how many it
// wrote.
func (u *Uplink) upsertDevices(ctx context.Context) (int, error) {
	if u.devices == nil {
		return 0, nil
	}
	pending := u.devices.PendingUpserts(100)
	for i, d := range pending {
		values := map[string]types.AttributeValue{
			":cid":   s(d.ConfirmationID),
			":caps":  capabilities(d.Capabilities),
			":seen":  s(d.LastSeenAt.UTC().Format(rfc3339)),
			":boot":  s(d.LastBootID),
			":fw":    s(d.FirmwareVersion),
			":pk":    s("devices"),
			":first": s(d.FirstRegisteredAt.UTC().Format(rfc3339)),
		}
		expr := deviceUpdate
		if d.FriendlyName != "" {
			expr += ", friendly_name = :fn"
			values[":fn"] = s(d.FriendlyName)
		}
		err := u.call(ctx, "UpdateItem", func(ctx context.Context) error {
			_, err := u.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
				TableName:                 aws.String(u.tables.Devices),
				Key:                       map[string]types.AttributeValue{"hardware_id": s(d.HardwareID)},
				UpdateExpression:          aws.String(expr),
				ExpressionAttributeValues: values,
			})
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

func capabilities(c contract.Capabilities) types.AttributeValue {
	sensors := make([]types.AttributeValue, 0, len(c.Sensors))
	for _, name := range c.Sensors {
		sensors = append(sensors, s(name))
	}
	features := make(map[string]types.AttributeValue, len(c.Features))
	for k, v := range c.Features {
		features[k] = &types.AttributeValueMemberBOOL{Value: v}
	}
	return &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
		"sensors":  &types.AttributeValueMemberL{Value: sensors},
		"features": &types.AttributeValueMemberM{Value: features},
	}}
}
