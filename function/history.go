package function

import (
	"context"
	"fmt"
	"slices"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/firmware-contract/quality"
	"greenhouse-gateway/internal/cloudread"
	"greenhouse-gateway/internal/tablewrite"
)

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
	})
	if err != nil {
		return nil, fmt.Errorf("Query of %s's newest readings: %w", hw, err)
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
		ProjectionExpression: aws.String("ts_batch"),
		ConsistentRead:       aws.Bool(true),
	}
	for {
		out, err := f.db.Query(ctx, in)
		if err != nil {
			return false, fmt.Errorf("Query of batch %s's readings: %w", b.BatchID, err)
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
