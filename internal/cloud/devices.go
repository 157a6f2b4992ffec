package cloud

import (
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"greenhouse-gateway/firmware-contract"
)

// DeviceUpsert is one version of a device's record in the devices table:
// the device registry produces it, the uplink writes it.
type DeviceUpsert struct {
	HardwareID        string
	ConfirmationID    string
	FriendlyName      string
	FirmwareVersion   string
	LastBootID        string
	Capabilities      contract.Capabilities
	FirstRegisteredAt time.Time
	LastSeenAt        time.Time
	// Version identifies this state; the source is told it was written.
	Version uint64
}

// deviceUpdate is the devices table upsert of schema 002: every attribute
// set, except first_registered_at, which is kept once written.
const deviceUpdate = "SET confirmation_id = :cid, capabilities = :caps, last_seen_at = :seen, " +
	"last_boot_id = :boot, firmware_version = :fw, gsi1pk = :pk, gsi1sk = :seen, " +
	"first_registered_at = if_not_exists(first_registered_at, :first)"

// DeviceUpdate returns the UpdateItem request that upserts d into the
// devices table of t: idempotent, so a replay writes the same record.
func DeviceUpdate(t Tables, d DeviceUpsert) *dynamodb.UpdateItemInput {
	values := map[string]types.AttributeValue{
		":cid":   str(d.ConfirmationID),
		":caps":  capabilities(d.Capabilities),
		":seen":  str(FormatTime(d.LastSeenAt)),
		":boot":  str(d.LastBootID),
		":fw":    str(d.FirmwareVersion),
		":pk":    str("devices"),
		":first": str(FormatTime(d.FirstRegisteredAt)),
	}
	expr := deviceUpdate
	if d.FriendlyName != "" {
		expr += ", friendly_name = :fn"
		values[":fn"] = str(d.FriendlyName)
	}
	return &dynamodb.UpdateItemInput{
		TableName:                 aws.String(t.Devices),
		Key:                       map[string]types.AttributeValue{"hardware_id": str(d.HardwareID)},
		UpdateExpression:          aws.String(expr),
		ExpressionAttributeValues: values,
	}
}

func capabilities(c contract.Capabilities) types.AttributeValue {
	sensors := make([]types.AttributeValue, 0, len(c.Sensors))
	for _, name := range c.Sensors {
		sensors = append(sensors, str(name))
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

func str(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
