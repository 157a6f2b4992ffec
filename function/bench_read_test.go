package function_test

import (
	"context"
	"fmt"
	"math"
	"net/url"
	"sort"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/cloudread"
	"greenhouse-gateway/internal/readquery"
	"greenhouse-gateway/internal/tablewrite"
)

// BenchmarkThirtyDaySummary stores 30 days of one device sending a reading
// a minute (43,200 readings of four sensors, in batches of ten) in
// DynamoDB Local, then times, in each iteration and in this order:
//
//   - the baseline: a plain paginated Query of the same readings (every
//     attribute, eventually consistent, ReturnConsumedCapacity TOTAL);
//   - the summary as the read API computes it (internal/cloudread, in this
//     process): day buckets in Europe/Berlin over the 30 days;
//   - the same summary through the function under the emulator (GET
//     /v1/devices/{hw}/summary, an API Gateway event).
//
// It reports each one's time, the read capacity both reads consumed, and
// the summary's time over the baseline's:
//
//	go test -run '^$' -bench ThirtyDaySummary -benchtime 3x ./function/
//
// (about three minutes here: storing the readings takes 40 s, each
// iteration 35 s).
func BenchmarkThirtyDaySummary(b *testing.B) {
	r := newRig(b, nil)
	ctx := context.Background()
	const hw = "AA:BB:CC:00:30:01"
	to := time.Now().Add(-time.Hour).Truncate(time.Hour)
	from := to.Add(-30 * 24 * time.Hour)
	n := storeMinutes(b, r, hw, from, to)
	require.Equal(b, 43200, n)

	q, err := readquery.ParseSummaryQuery(url.Values{"from": {from.Format(time.RFC3339)}, "to": {to.Format(time.RFC3339)},
		"granularity": {"day"}, "tz": {"Europe/Berlin"}}, time.Now())
	require.NoError(b, err)
	reader := cloudread.New(r.db, r.tables)
	fromMS, toMS := readquery.WindowMS(from, to)
	// Warm DynamoDB Local's caches for both reads alike.
	_, warm := plainQuery(b, r, hw, fromMS, toMS)
	require.Equal(b, n, warm.Items)

	var plain, summary, viaFunction []time.Duration
	var plainStats, summaryStats cloudread.Stats
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		_, plainStats = plainQuery(b, r, hw, fromMS, toMS)
		plain = append(plain, time.Since(start))

		start = time.Now()
		s, st, err := reader.Summary(ctx, hw, q)
		summary = append(summary, time.Since(start))
		require.NoError(b, err)
		summaryStats = st
		require.EqualValues(b, n, s.Totals["bme280_temp_c"].Count)
		require.Equal(b, s.BucketsTotal, s.BucketsActive, "a reading in every day")

		start = time.Now()
		code, body := r.get(b, "/v1/devices/"+hw+"/summary", url.Values{"from": {from.Format(time.RFC3339)},
			"to": {to.Format(time.RFC3339)}, "granularity": {"day"}, "tz": {"Europe/Berlin"}}, true, "")
		viaFunction = append(viaFunction, time.Since(start))
		require.Equal(b, 200, code, body)
	}
	b.StopTimer()
	med := func(ds []time.Duration) time.Duration {
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[len(ds)/2]
	}
	p, s, f := med(plain), med(summary), med(viaFunction)
	b.ReportMetric(float64(p.Milliseconds()), "query-ms")
	b.ReportMetric(float64(s.Milliseconds()), "summary-ms")
	b.ReportMetric(float64(f.Milliseconds()), "function-summary-ms")
	b.ReportMetric(plainStats.ReadCapacity, "query-RCU")
	b.ReportMetric(summaryStats.ReadCapacity, "summary-RCU")
	b.ReportMetric(s.Seconds()/p.Seconds(), "summary/query")
	b.Logf("%d readings over 30 days, median of %d runs:", n, b.N)
	b.Logf("  plain paginated Query (baseline): %v, %d requests, %.1f RCU", p.Round(time.Millisecond), plainStats.Requests, plainStats.ReadCapacity)
	b.Logf("  summary, day buckets in Europe/Berlin (cloudread): %v, %d requests, %.1f RCU (%.2fx the baseline's time, %.2fx its RCU)",
		s.Round(time.Millisecond), summaryStats.Requests, summaryStats.ReadCapacity, s.Seconds()/p.Seconds(),
		summaryStats.ReadCapacity/math.Max(plainStats.ReadCapacity, 1e-9))
	b.Logf("  the same summary through the function under the emulator: %v (%.2fx the baseline's time)",
		f.Round(time.Millisecond), f.Seconds()/p.Seconds())
}

// storeMinutes writes a reading a minute of hw in [from, to), four sensors,
// ten readings a batch, straight into device_readings, and returns how many.
func storeMinutes(b *testing.B, r *rig, hw string, from, to time.Time) int {
	b.Helper()
	var reqs []types.WriteRequest
	n := 0
	for t0 := from; t0.Before(to); t0 = t0.Add(10 * time.Minute) {
		cb := &contract.Batch{HardwareID: hw, BootID: testBoot, FirmwareVersion: "1.0.16"}
		for i := range 10 {
			ts := t0.Add(time.Duration(i) * time.Minute)
			if !ts.Before(to) {
				break
			}
			m := float64(n % 1440)
			cb.Readings = append(cb.Readings, contract.Reading{TimestampMS: ts.UnixMilli(),
				Sensors: map[string]float64{"bme280_temp_c": 18 + 6*math.Sin(m/229), "humidity_pct": 60 - 10*math.Sin(m/229),
					"pressure_hpa": 1013.25, "soil_moisture_pct": 40 + float64(n%97)/10},
				SensorStatus: map[string]string{"bme280": "ok", "soil_moisture": "ok"}})
			n++
		}
		cb.BatchID = fmt.Sprintf("%s_%s_%d_%d", hw, testBoot, cb.Readings[0].TimestampMS, cb.Readings[len(cb.Readings)-1].TimestampMS)
		it := tablewrite.Build(tablewrite.Batch{Batch: cb, ReceivedAt: time.Now(), Hash: cb.IdentityHash(),
			Quality: make([]float64, len(cb.Readings))}, 90*24*time.Hour, time.Now())
		for _, item := range it.ReadingItems() {
			reqs = append(reqs, types.WriteRequest{PutRequest: &types.PutRequest{Item: item}})
		}
	}
	// Eight writers, each taking every eighth request.
	errs := make(chan error, 8)
	for w := range 8 {
		go func() {
			for i := w * 25; i < len(reqs); i += 8 * 25 {
				part := reqs[i:min(i+25, len(reqs))]
				for len(part) > 0 {
					out, err := r.db.BatchWriteItem(context.Background(), &dynamodb.BatchWriteItemInput{
						RequestItems: map[string][]types.WriteRequest{r.tables.Readings: part}})
					if err != nil {
						errs <- err
						return
					}
					part = out.UnprocessedItems[r.tables.Readings]
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		require.NoError(b, <-errs)
	}
	return n
}

// plainQuery reads hw's readings in [fromMS, toMS) with the SDK's
// paginator, every attribute, and returns how many and what they cost.
func plainQuery(b *testing.B, r *rig, hw string, fromMS, toMS int64) (int, cloudread.Stats) {
	b.Helper()
	var st cloudread.Stats
	p := dynamodb.NewQueryPaginator(r.db, &dynamodb.QueryInput{
		TableName:              aws.String(r.tables.Readings),
		KeyConditionExpression: aws.String("hardware_id = :hw AND ts_batch BETWEEN :lo AND :hi"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":hw": &types.AttributeValueMemberS{Value: hw},
			":lo": &types.AttributeValueMemberS{Value: cloudread.SortKeyBound(fromMS, "")},
			":hi": &types.AttributeValueMemberS{Value: cloudread.SortKeyBound(toMS, "")}},
		ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
	})
	for p.HasMorePages() {
		out, err := p.NextPage(context.Background())
		require.NoError(b, err)
		st.Requests++
		st.Items += len(out.Items)
		if out.ConsumedCapacity != nil && out.ConsumedCapacity.CapacityUnits != nil {
			st.ReadCapacity += *out.ConsumedCapacity.CapacityUnits
		}
	}
	return st.Items, st
}
