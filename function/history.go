package function

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/firmware-contract/quality"
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
		r := contract.Reading{Sensors: map[string]float64{}}
		if n, ok := item["timestamp_ms"].(*types.AttributeValueMemberN); ok {
			r.TimestampMS, _ = strconv.ParseInt(n.Value, 10, 64)
		}
		if m, ok := item["sensors"].(*types.AttributeValueMemberM); ok {
			for k, v := range m.Value {
				if n, ok := v.(*types.AttributeValueMemberN); ok {
					if x, err := strconv.ParseFloat(n.Value, 64); err == nil {
						r.Sensors[k] = x
					}
				}
			}
		}
		readings = append(readings, r)
	}
	slices.Reverse(readings)
	return readings, nil
}
