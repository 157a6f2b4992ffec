package function

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/uuid"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/cloud"
)

// register answers POST /v1/register as the gateway does: 201 with the
// confirmation_id at a device's first registration, 200 with the same one
// afterwards, 400 invalid, 403 for a key bound to another device.
func (f *Function) register(ctx context.Context, key cloud.KeyInfo, body []byte) answer {
	reg, err := contract.DecodeRegistration(body, "")
	if err == nil {
		err = boundTo(key, reg.HardwareID)
	}
	if err != nil {
		code := http.StatusBadRequest
		if contract.AsError(err).Reason == contract.ReasonForbidden {
			code = http.StatusForbidden
		}
		return jsonAnswer(code, contract.RegisterAck("", err))
	}
	id, first, err := f.registerDevice(ctx, reg)
	if err != nil {
		f.logger.Warn("registration not stored", "hardware_id", reg.HardwareID, "err", err)
		return jsonAnswer(http.StatusServiceUnavailable, contract.RegisterAck("", contract.NewError(contract.ReasonBufferFull, "",
			"the cloud could not store the registration now; retry later")))
	}
	if first {
		return jsonAnswer(http.StatusCreated, contract.RegisterAck(id, nil))
	}
	return jsonAnswer(http.StatusOK, contract.RegisterAck(id, nil))
}

// registerDevice upserts the device's record, keeping the confirmation_id
// and first_registered_at of an earlier registration, and returns the
// confirmation_id and whether this is the first registration.
func (f *Function) registerDevice(ctx context.Context, reg *contract.Registration) (string, bool, error) {
	out, err := f.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:            aws.String(f.cfg.Tables.Devices),
		Key:                  map[string]types.AttributeValue{"hardware_id": &types.AttributeValueMemberS{Value: reg.HardwareID}},
		ConsistentRead:       aws.Bool(true),
		ProjectionExpression: aws.String("confirmation_id, first_registered_at"),
	})
	if err != nil {
		return "", false, fmt.Errorf("GetItem of device %s: %w", reg.HardwareID, err)
	}
	now := f.now()
	d := cloud.DeviceUpsert{HardwareID: reg.HardwareID, FriendlyName: reg.FriendlyName, FirmwareVersion: reg.FirmwareVersion,
		LastBootID: reg.BootID, Capabilities: reg.Capabilities, FirstRegisteredAt: now, LastSeenAt: now}
	cid, _ := out.Item["confirmation_id"].(*types.AttributeValueMemberS)
	first := cid == nil
	if first {
		d.ConfirmationID = uuid.NewString()
	} else {
		d.ConfirmationID = cid.Value
		if fr, ok := out.Item["first_registered_at"].(*types.AttributeValueMemberS); ok {
			if t, err := time.Parse(time.RFC3339, fr.Value); err == nil {
				d.FirstRegisteredAt = t
			}
		}
	}
	if err := f.upsertDevice(ctx, d); err != nil {
		return "", false, err
	}
	return d.ConfirmationID, first, nil
}
