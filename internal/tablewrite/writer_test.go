package tablewrite_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/tablewrite"
)

// testHour is the hour testBatch's windows start from, fixed when the test
// binary starts: a test that builds the same batch twice gets the same
// batch_id even when an hour turns between the two.
var testHour = time.Now().Truncate(time.Hour)

func testBatch(hw string, window, readings int, temp float64) *contract.Batch {
	boot := "7c9e6679-7425-40de-944b-e07fc1f90ae7"
	// Recent: DynamoDB Local's TTL deletes readings older than the retention.
	start := testHour.UnixMilli() + int64(window)*600_000
	b := &contract.Batch{
		BatchID:         fmt.Sprintf("%s_%s_%d_%d", hw, boot, start, start+600_000),
		HardwareID:      hw,
		BootID:          boot,
		FirmwareVersion: "1.0.16",
	}
	for i := range readings {
		b.Readings = append(b.Readings, contract.Reading{
			TimestampMS:  start + int64(i)*1000,
			Sensors:      map[string]float64{"bme280_temp_c": temp},
			SensorStatus: map[string]string{"bme280": "ok"},
		})
	}
	return b
}

func build(b *contract.Batch, quality []float64) *tablewrite.Items {
	return tablewrite.Build(tablewrite.Batch{Batch: b, ReceivedAt: time.Now(), Hash: b.IdentityHash(), Quality: quality},
		90*24*time.Hour, time.Now())
}

func readingsOf(t *testing.T, client *dynamodb.Client, table, hw string) []map[string]types.AttributeValue {
	t.Helper()
	out, err := client.Query(context.Background(), &dynamodb.QueryInput{
		TableName:                 aws.String(table),
		KeyConditionExpression:    aws.String("hardware_id = :hw"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":hw": &types.AttributeValueMemberS{Value: hw}},
		ConsistentRead:            aws.Bool(true),
	})
	require.NoError(t, err)
	return out.Items
}

// localWriter returns a client of the shared DynamoDB Local, fresh tables
// in it and a writer of them.
func localWriter(t *testing.T) (*dynamodb.Client, cloud.Tables, *tablewrite.Writer) {
	t.Helper()
	local := dynamotest.Shared(t)
	tables := local.NewTables(t)
	client := local.Client(t)
	return client, tables, tablewrite.New(client, tables, tablewrite.Options{})
}

func TestSameBatchIsDuplicateAndAnotherPayloadIsConflict(t *testing.T) {
	client, tables, w := localWriter(t)
	ctx := context.Background()
	for _, tt := range []struct {
		name     string
		hw       string
		readings int
		limit    int
	}{
		{"transaction", "EE:00:00:00:15:01", 3, 10},
		{"split", "EE:00:00:00:15:02", 30, 10},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := testBatch(tt.hw, 0, tt.readings, 21.5)
			require.Equal(t, tablewrite.Delivered, w.Write(ctx, build(b, nil), tt.limit).Outcome)
			require.Equal(t, tablewrite.Duplicate, w.Write(ctx, build(b, nil), tt.limit).Outcome)
			other := testBatch(tt.hw, 0, tt.readings, 30)
			r := w.Write(ctx, build(other, nil), tt.limit)
			require.Equal(t, tablewrite.Conflict, r.Outcome)
			require.ErrorContains(t, r.Err, "another payload")
			items := readingsOf(t, client, tables.Readings, tt.hw)
			require.Len(t, items, tt.readings)
			for _, item := range items {
				temp := item["sensors"].(*types.AttributeValueMemberM).Value["bme280_temp_c"]
				require.Equal(t, &types.AttributeValueMemberN{Value: "21.5"}, temp, "the cloud keeps the first payload")
			}
		})
	}
}

func TestMarkerWithoutHashAnswersDuplicate(t *testing.T) {
	client, tables, w := localWriter(t)
	ctx := context.Background()
	b := testBatch("EE:00:00:00:15:03", 0, 2, 20)
	// A marker as written before the payload hash.
	_, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(tables.ProcessedBatches),
		Item: map[string]types.AttributeValue{
			"batch_id": &types.AttributeValueMemberS{Value: b.BatchID}, "hardware_id": &types.AttributeValueMemberS{Value: b.HardwareID},
			"received_at": &types.AttributeValueMemberS{Value: "2024-01-01T00:00:00Z"}, "expiration_time": &types.AttributeValueMemberN{Value: "1"},
		}})
	require.NoError(t, err)
	require.Equal(t, tablewrite.Duplicate, w.Write(ctx, build(b, nil), 10).Outcome)
	hashes, err := w.MarkerHashes(ctx, []string{b.BatchID, "absent", b.BatchID})
	require.NoError(t, err)
	require.Equal(t, map[string]string{b.BatchID: ""}, hashes)
}

func TestBulkWritesQualityScoresAndReportsEachBatch(t *testing.T) {
	client, tables, w := localWriter(t)
	ctx := context.Background()
	first := testBatch("EE:00:00:00:15:04", 0, 3, 20)
	require.Equal(t, tablewrite.Delivered, w.Write(ctx, build(first, nil), 10).Outcome)
	batches := []*tablewrite.Items{
		build(first, nil), // duplicate
		build(testBatch("EE:00:00:00:15:04", 0, 3, 99), nil),               // conflict
		build(testBatch("EE:00:00:00:15:05", 1, 2, 20), []float64{1, 0.5}), // new, scored
	}
	results := w.WriteBulk(ctx, batches, 4)
	require.Equal(t, []tablewrite.Outcome{tablewrite.Duplicate, tablewrite.Conflict, tablewrite.Delivered},
		[]tablewrite.Outcome{results[0].Outcome, results[1].Outcome, results[2].Outcome})
	items := readingsOf(t, client, tables.Readings, "EE:00:00:00:15:05")
	require.Len(t, items, 2)
	require.Equal(t, &types.AttributeValueMemberN{Value: "0.5"}, items[1][tablewrite.AttrQualityScore])
	hashes, err := w.MarkerHashes(ctx, []string{first.BatchID})
	require.NoError(t, err)
	h := first.IdentityHash()
	require.Equal(t, fmt.Sprintf("%x", h[:]), hashes[first.BatchID])
}

func TestValidationRefusalIsRejected(t *testing.T) {
	local := dynamotest.Shared(t)
	client := local.Client(t)
	// Tables that do not exist are not a refusal of the content.
	w := tablewrite.New(client, cloud.TableNames("missing-"), tablewrite.Options{})
	r := w.Write(context.Background(), build(testBatch("EE:00:00:00:15:06", 0, 1, 20), nil), 10)
	require.Equal(t, tablewrite.Failed, r.Outcome)
	require.False(t, r.InCloud())
}

func TestARefusedBatchLeavesNoneOfItsReadings(t *testing.T) {
	client, tables, w := localWriter(t)
	ctx := context.Background()
	// 30 readings, the 28th beyond DynamoDB's number range: its first 25
	// are written before DynamoDB refuses the rest.
	spoiled := func(hw string, window int) *tablewrite.Items {
		b := testBatch(hw, window, 30, 20)
		b.Readings[27].Sensors["bme280_temp_c"] = 1e200
		return build(b, nil)
	}
	for _, tt := range []struct {
		name  string
		hw    string
		write func(it *tablewrite.Items) tablewrite.Result
	}{
		{"split", "EE:00:00:00:16:01", func(it *tablewrite.Items) tablewrite.Result { return w.Write(ctx, it, 10) }},
		{"looked up", "EE:00:00:00:16:02", func(it *tablewrite.Items) tablewrite.Result {
			// Behind a batch of 5: the first request holds readings 0-19
			// of the refused batch, the second the rest.
			return w.WriteLookedUp(ctx, []*tablewrite.Items{build(testBatch("EE:00:00:00:16:12", 0, 5, 20), nil), it}, 1)[1]
		}},
		{"bulk", "EE:00:00:00:16:03", func(it *tablewrite.Items) tablewrite.Result {
			return w.WriteBulk(ctx, []*tablewrite.Items{build(testBatch("EE:00:00:00:16:13", 0, 5, 20), nil), it}, 1)[1]
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.write(spoiled(tt.hw, 0))
			require.Equal(t, tablewrite.Rejected, r.Outcome, "%v", r.Err)
			require.Zero(t, len(readingsOf(t, client, tables.Readings, tt.hw)), "readings of the refused batch")
			hashes, err := w.MarkerHashes(ctx, []string{spoiled(tt.hw, 0).BatchID})
			require.NoError(t, err)
			require.Empty(t, hashes)
		})
	}
	require.Len(t, readingsOf(t, client, tables.Readings, "EE:00:00:00:16:12"), 5, "the other batch written without a lookup")
	require.Len(t, readingsOf(t, client, tables.Readings, "EE:00:00:00:16:13"), 5, "the bulk's other batch")
}

func TestARefusedTransactionDeletesTheReadingsOfAnEarlierAttempt(t *testing.T) {
	client, tables, w := localWriter(t)
	ctx := context.Background()
	hw := "EE:00:00:00:17:01"
	b := testBatch(hw, 0, 30, 20)
	b.Readings[27].Sensors["bme280_temp_c"] = 1e200
	// An earlier attempt wrote readings 0-19 (the request with the rest
	// was refused, and the attempt failed before it found out why).
	earlier := testBatch(hw, 0, 30, 20)
	earlier.Readings = earlier.Readings[:20]
	var reqs []types.WriteRequest
	for _, raw := range build(earlier, nil).Encode() {
		reqs = append(reqs, types.WriteRequest{PutRequest: &types.PutRequest{Item: cloud.EncodedItem(raw)}})
	}
	_, err := client.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{RequestItems: map[string][]types.WriteRequest{tables.Readings: reqs}})
	require.NoError(t, err)
	require.Equal(t, 20, len(readingsOf(t, client, tables.Readings, hw)))
	// Tried again alone, it fits a transaction, which DynamoDB refuses.
	r := w.Write(ctx, build(b, nil), 100)
	require.Equal(t, tablewrite.Rejected, r.Outcome, "%v", r.Err)
	require.Zero(t, len(readingsOf(t, client, tables.Readings, hw)), "readings of a batch reported Rejected")
}
