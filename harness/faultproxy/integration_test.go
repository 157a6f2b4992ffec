package faultproxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/harness/faultproxy"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/tablewrite"
	"greenhouse-gateway/uplink"
)

func TestMain(m *testing.M) { dynamotest.Main(m) }

// TestUplinkThroughFaultsDeliversExactlyOnce runs the real uplink, with a
// real buffer, against DynamoDB Local through the proxy, and checks that
// every batch is in DynamoDB exactly once: one processed_batches marker
// per batch, and exactly the readings it holds. Batch sizes cover both of
// the uplink's paths (one transaction up to 9 readings on DynamoDB Local,
// readings first and marker last above).
func TestUplinkThroughFaultsDeliversExactlyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("needs DynamoDB Local")
	}
	tests := []struct {
		name      string
		writeMode string // uplink.Config.WriteMode; empty is the default (batch)
		plan      []faultproxy.Chance
		check     func(t *testing.T, s faultproxy.Stats, reg *prometheus.Registry)
	}{
		{
			name:      "lost_response in transaction write mode",
			writeMode: "transaction",
			plan:      []faultproxy.Chance{{Fault: faultproxy.Fault{Mode: faultproxy.LostResponse}, P: 0.5}},
			check: func(t *testing.T, s faultproxy.Stats, reg *prometheus.Registry) {
				require.Positive(t, s.AnswersLost, "writes committed whose answer was lost")
				// A lost answer makes the uplink send the batch again; the
				// marker turns the resend into "already delivered".
				require.Positive(t, counter(reg, "gateway_uplink_batches_total", "already_delivered"))
			},
		},
		{
			// Half the answers lost: each failed request makes its batches
			// go again in a later round, so a request carrying markers whose
			// answer is lost is all but certain; the lookup then finds them.
			name: "lost_response in batch write mode",
			plan: []faultproxy.Chance{{Fault: faultproxy.Fault{Mode: faultproxy.LostResponse}, P: 0.5}},
			check: func(t *testing.T, s faultproxy.Stats, reg *prometheus.Registry) {
				require.Positive(t, s.AnswersLost)
				require.Positive(t, counter(reg, "gateway_uplink_batches_total", "already_delivered"))
			},
		},
		{
			name: "throttle",
			plan: []faultproxy.Chance{{Fault: faultproxy.Fault{Mode: faultproxy.Throttle}, P: 0.5}},
			check: func(t *testing.T, s faultproxy.Stats, reg *prometheus.Registry) {
				require.Positive(t, s.Errors[faultproxy.CodeProvisionedThroughputExceeded])
				require.Positive(t, s.Errors[faultproxy.CodeThrottling])
				require.Positive(t, counter(reg, "gateway_uplink_request_errors_total", faultproxy.CodeProvisionedThroughputExceeded))
				require.Positive(t, counter(reg, "gateway_uplink_request_errors_total", faultproxy.CodeThrottling))
			},
		},
		{
			name: "every fault mixed",
			plan: []faultproxy.Chance{
				{Fault: faultproxy.Fault{Mode: faultproxy.LostResponse}, P: 0.15},
				{Fault: faultproxy.Fault{Mode: faultproxy.Truncate}, P: 0.1},
				{Fault: faultproxy.Fault{Mode: faultproxy.Reset}, P: 0.1},
				{Fault: faultproxy.Fault{Mode: faultproxy.Throttle}, P: 0.1},
				{Fault: faultproxy.Fault{Mode: faultproxy.Error5xx}, P: 0.1},
				{Fault: faultproxy.Fault{Mode: faultproxy.Latency, Delay: 20 * time.Millisecond}, P: 0.1},
				{Fault: faultproxy.Fault{Mode: faultproxy.Blackhole}, P: 0.02},
			},
			check: func(t *testing.T, s faultproxy.Stats, reg *prometheus.Registry) {
				require.Positive(t, s.AnswersLost)
			},
		},
	}
	local := dynamotest.Shared(t)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := local.Client(t)
			tables := local.NewTables(t)
			p, url := startTo(t, local.Endpoint, uint64(100+i))
			require.NoError(t, p.Mix(tt.plan...))

			buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
			require.NoError(t, err)
			t.Cleanup(func() { buf.Close() })
			want := map[string]batchWant{}
			for d := range 3 {
				hw := fmt.Sprintf("AA:BB:CC:00:0%d:01", d)
				for w := range 10 {
					n := 1 + (w*3+d)%14 // 1..14 readings: both paths
					b := testBatch(t, hw, w, n)
					commit(t, buf, b)
					want[b.BatchID] = batchWant{hw: hw, readings: n}
				}
			}

			// The uplink's own client, through the proxy, without SDK retries
			// (gatewayd's settings): the uplink owns the retries.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			upClient, err := cloud.NewClient(ctx, cloud.Config{Endpoint: url, Region: "us-east-1"}, cloud.WithRetryMaxAttempts(1))
			require.NoError(t, err)
			probe := func(ctx context.Context) (int, error) {
				return cloud.ProbeTransactionLimit(ctx, upClient, tables.ProcessedBatches)
			}
			reg := prometheus.NewRegistry()
			logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			up, err := uplink.New(uplink.Config{WriteMode: tt.writeMode, Concurrency: 3, RequestTimeout: 2 * time.Second,
				MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, PollInterval: 50 * time.Millisecond}, uplink.Deps{Store: buf, DynamoDB: upClient, Probe: probe, Tables: tables, Logger: logger, Registerer: reg})
			require.NoError(t, err)
			runCtx, stop := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- up.Run(runCtx) }()
			require.Eventually(t, func() bool { return buf.Stats().PendingBatches == 0 }, 120*time.Second, 20*time.Millisecond,
				"proxy: %+v", p.Stats())
			stop()
			require.NoError(t, <-done)
			require.NoError(t, p.Set(faultproxy.Fault{})) // release anything still held

			checkExactlyOnce(t, client, tables, want)
			s := p.Stats()
			t.Logf("%s: %d batches delivered exactly once through %d requests %v; answers lost %d; uplink delivered %v, already delivered %v",
				tt.name, len(want), s.Total(), s.Requests, s.AnswersLost,
				counter(reg, "gateway_uplink_batches_total", "delivered"), counter(reg, "gateway_uplink_batches_total", "already_delivered"))
			tt.check(t, s, reg)
		})
	}
}

type batchWant struct {
	hw       string
	readings int
}

// startTo serves a proxy to target on a loopback port.
func startTo(t testing.TB, target string, seed uint64) (*faultproxy.Proxy, string) {
	t.Helper()
	p := faultproxy.Start(t, target, seed)
	return p, p.URL()
}

// testBatch builds a valid batch of n readings for hw, one per second,
// in window w.
func testBatch(t testing.TB, hw string, w, n int) *contract.Batch {
	t.Helper()
	boot := uuid.NewString()
	end := time.Now().Add(-time.Hour).UnixMilli() + int64(w)*100_000
	start := end - int64(n)*1000
	readings := make([]map[string]any, 0, n)
	for i := range n {
		readings = append(readings, map[string]any{
			"timestamp_ms":  start + int64(i+1)*1000,
			"sensors":       map[string]any{"bme280_temp_c": 21.5 + float64(i)/10},
			"sensor_status": map[string]string{"bme280": "ok"},
		})
	}
	raw, err := json.Marshal(map[string]any{
		"batch_id": fmt.Sprintf("%s_%s_%d_%d", hw, boot, start, end), "hardware_id": hw, "boot_id": boot,
		"firmware_version": "1.0.16", "readings": readings,
	})
	require.NoError(t, err)
	b, err := contract.DecodeBatch(raw, hw, contract.DefaultLimits(), time.Now())
	require.NoError(t, err)
	return b
}

func commit(t testing.TB, buf *buffer.Buffer, b *contract.Batch) {
	t.Helper()
	c := b.Canonical()
	out, err := buf.Commit(context.Background(), []buffer.Entry{{BatchID: b.BatchID, HardwareID: b.HardwareID,
		Hash: contract.PayloadHash(c), Payload: c, ReceivedAt: time.Now()}})
	require.NoError(t, err)
	require.Equal(t, []buffer.Outcome{buffer.Stored}, out)
}

// checkExactlyOnce reads both tables directly (not through the proxy) and
// compares them with want.
func checkExactlyOnce(t testing.TB, client *dynamodb.Client, tables cloud.Tables, want map[string]batchWant) {
	t.Helper()
	markers := map[string]string{} // batch_id → hardware_id
	for _, it := range scan(t, client, tables.ProcessedBatches) {
		id := it["batch_id"].(*types.AttributeValueMemberS).Value
		markers[id] = it["hardware_id"].(*types.AttributeValueMemberS).Value
	}
	readings := map[string]int{}
	for _, it := range scan(t, client, tables.Readings) {
		id := it["batch_id"].(*types.AttributeValueMemberS).Value
		ts := it["ts_batch"].(*types.AttributeValueMemberS).Value
		ms, err := strconv.ParseInt(it["timestamp_ms"].(*types.AttributeValueMemberN).Value, 10, 64)
		require.NoError(t, err)
		require.Equal(t, tablewrite.TSBatch(ms, id), ts, "sort key of a reading of %s", id)
		readings[id]++
	}
	require.Len(t, markers, len(want), "one marker per batch, none other")
	for id, w := range want {
		require.Equal(t, w.hw, markers[id], "marker of %s", id)
		require.Equal(t, w.readings, readings[id], "readings of %s", id)
	}
	require.Len(t, readings, len(want), "no readings of other batches")
}

func scan(t testing.TB, client *dynamodb.Client, table string) []map[string]types.AttributeValue {
	t.Helper()
	var items []map[string]types.AttributeValue
	p := dynamodb.NewScanPaginator(client, &dynamodb.ScanInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true)})
	for p.HasMorePages() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		page, err := p.NextPage(ctx)
		cancel()
		require.NoError(t, err)
		items = append(items, page.Items...)
	}
	return items
}

// counter sums the series of a counter whose label values include label.
func counter(reg *prometheus.Registry, name, label string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return -1
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == label {
					total += m.GetCounter().GetValue()
					break
				}
			}
		}
	}
	return total
}
