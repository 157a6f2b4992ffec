package function

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/firmware-contract/quality"
	"greenhouse-gateway/function/event"
	"greenhouse-gateway/internal/cloudread"
	"greenhouse-gateway/internal/tablewrite"
)

// newestReadings returns the device's newest readings: its hint when the
// function may use it (usableHint), else what recentReadings reads.
func (f *Function) newestReadings(ctx context.Context, hw string, hint []contract.Reading) ([]contract.Reading, error) {
	if f.usableHint(hint) {
		observed(ctx).history(true)
		return slices.Clone(hint), nil
	}
	observed(ctx).history(false)
	return f.recentReadings(ctx, hw)
}

// usableHint reports whether a device's history hint (event.HistoryHint)
// may stand for its newest readings in device_readings. The gateway is
// the IAM-authenticated writer of its devices' batches and sends only
// the readings of batches the function answered delivered or duplicate,
// but it cannot see a device's batches written another way (the HTTP
// API, another gateway), so a hint may be stale. The function therefore
// uses one only where staleness can change nothing the contract
// guarantees: under accept_older, where the newest readings give the
// quality scores and the log line of an older batch, never whether a
// batch is stored. Under reject_older it reads them. A hint must hold
// exactly quality.HistoryLen readings (what the read returns for a device
// with a history; the gateway may have seen fewer delivered), in time
// order, with finite values (hints checks them as it decodes).
func (f *Function) usableHint(hint []contract.Reading) bool {
	return f.cfg.Ordering == "accept_older" && len(hint) == quality.HistoryLen
}

// hints returns the usable history hints of a gateway_batches event by
// device: those of HistoryLen readings in time order with finite sensor
// values, one per device (a device named twice has none). A hint that
// is not usable is left out; its device's readings are read.
func hints(hs []event.HistoryHint) map[string][]contract.Reading {
	if len(hs) == 0 {
		return nil
	}
	out := make(map[string][]contract.Reading, len(hs))
	seen := map[string]int{}
	for _, h := range hs {
		seen[h.HardwareID]++
	}
	for _, h := range hs {
		if seen[h.HardwareID] > 1 {
			continue
		}
		if rs, ok := hintReadings(h.Readings); ok {
			out[h.HardwareID] = rs
		}
	}
	return out
}

// hintReadings converts a hint's readings; ok is false when there are not
// HistoryLen of them, they are not in time order, or a value is not
// finite.
func hintReadings(in []event.HistoryReading) ([]contract.Reading, bool) {
	if len(in) != quality.HistoryLen {
		return nil, false
	}
	out := make([]contract.Reading, len(in))
	for i, r := range in {
		if i > 0 && r.TimestampMS < in[i-1].TimestampMS {
			return nil, false
		}
		for _, v := range r.Sensors {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, false
			}
		}
		out[i] = contract.Reading{TimestampMS: r.TimestampMS, Sensors: r.Sensors}
	}
	return out, true
}

// recentReadings returns the device's newest quality.HistoryLen readings
// in device_readings, oldest first, with their timestamps and sensor
// values: the ordering rule's newest reading and the quality checks'
// recent values.
func (f *Function) recentReadings(ctx context.Context, hw string) ([]contract.Reading, error) {
	out, err := f.db.Query(ctx, &dynamodb.QueryInput{
		TableName:                 aws.String(f.cfg.Tables.Readings),
		KeyConditionExpression:    aws.String("hardware_id = :hw"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":hw": &types.AttributeValueMemberS{Value: hw}},
		ProjectionExpression:      aws.String("timestamp_ms, sensors"),
		ScanIndexForward:          aws.Bool(false),
		Limit:                     aws.Int32(quality.HistoryLen),
		ConsistentRead:            aws.Bool(true),
		ReturnConsumedCapacity:    types.ReturnConsumedCapacityTotal,
	})
	if err != nil {
		return nil, fmt.Errorf("Query of %s's newest readings: %w", hw, err)
	}
	if out.ConsumedCapacity != nil {
		observed(ctx).consumed("Query", aws.ToFloat64(out.ConsumedCapacity.CapacityUnits))
	}
	readings := make([]contract.Reading, 0, len(out.Items))
	for _, item := range out.Items {
		readings = append(readings, cloudread.ItemReading(item))
	}
	slices.Reverse(readings)
	return readings, nil
}

// hasReadings reports whether device_readings holds a reading of batch b
// (one written before its marker, by an attempt that did not finish). It
// reads the keys of b's time span, b's own only.
func (f *Function) hasReadings(ctx context.Context, b *contract.Batch) (bool, error) {
	if len(b.Readings) == 0 {
		return false, nil
	}
	lo, hi := b.Readings[0].TimestampMS, b.Readings[0].TimestampMS
	for _, r := range b.Readings {
		lo, hi = min(lo, r.TimestampMS), max(hi, r.TimestampMS)
	}
	in := &dynamodb.QueryInput{
		TableName:              aws.String(f.cfg.Tables.Readings),
		KeyConditionExpression: aws.String("hardware_id = :hw AND ts_batch BETWEEN :lo AND :hi"),
		FilterExpression:       aws.String("batch_id = :id"),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":hw": &types.AttributeValueMemberS{Value: b.HardwareID},
			":lo": &types.AttributeValueMemberS{Value: tablewrite.TSBatch(lo, b.BatchID)},
			":hi": &types.AttributeValueMemberS{Value: tablewrite.TSBatch(hi, b.BatchID)},
			":id": &types.AttributeValueMemberS{Value: b.BatchID},
		},
		ProjectionExpression:   aws.String("ts_batch"),
		ConsistentRead:         aws.Bool(true),
		ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
	}
	for {
		out, err := f.db.Query(ctx, in)
		if err != nil {
			return false, fmt.Errorf("Query of batch %s's readings: %w", b.BatchID, err)
		}
		if out.ConsumedCapacity != nil {
			observed(ctx).consumed("Query", aws.ToFloat64(out.ConsumedCapacity.CapacityUnits))
		}
		if len(out.Items) > 0 {
			return true, nil
		}
		if len(out.LastEvaluatedKey) == 0 {
			return false, nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}
