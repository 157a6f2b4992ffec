package uplink_test

import (
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/uplink"
)

// recordingDB is an in-memory DynamoDB for the transaction write mode: it
// remembers every written batch in order and can throttle, or apply a
// write and then lose its answer.
type recordingDB struct {
	uplink.DynamoDB
	mu              sync.Mutex
	written         []string       // batch_ids in write order (one entry per applied write)
	throttle        int            // the next this many writes are throttled
	loseOnce        map[string]int // batch_id: apply, then fail with a network error, this many times
	failOnce        int            // the next this many writes fail without being applied
	onWrite         func()         // called at each write, outside mu
	latency         time.Duration  // each write's round trip; 200µs when zero
	inflight        int
	maxFlight       int
	gets            int            // BatchGetItem calls
	unprocessedGets int            // the next this many BatchGetItem calls leave half the keys unprocessed
	writes          int            // writes applied
	attempts        map[string]int // write requests by batch_id
}

func (f *recordingDB) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, _ ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	if f.onWrite != nil {
		f.onWrite()
	}
	f.mu.Lock()
	f.inflight++
	f.maxFlight = max(f.maxFlight, f.inflight)
	f.mu.Unlock()
	// Let concurrent requests overlap, so that in-flight counts mean something.
	time.Sleep(cmp.Or(f.latency, 200*time.Microsecond))
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inflight--
	id := in.TransactItems[len(in.TransactItems)-1].Put.Item["batch_id"].(*types.AttributeValueMemberS).Value
	if f.attempts == nil {
		f.attempts = map[string]int{}
	}
	f.attempts[id]++
	switch {
	case f.throttle > 0:
		f.throttle--
		return nil, &types.ProvisionedThroughputExceededException{Message: aws.String("rate of requests exceeds the allowed throughput")}
	case f.failOnce > 0:
		f.failOnce--
		return nil, errors.New("connection reset by peer")
	case slices.Contains(f.written, id):
		reasons := make([]types.CancellationReason, len(in.TransactItems))
		for i := range reasons {
			reasons[i].Code = aws.String("None")
		}
		reasons[len(reasons)-1].Code = aws.String("ConditionalCheckFailed")
		return nil, &types.TransactionCanceledException{Message: aws.String("cancelled"), CancellationReasons: reasons}
	}
	f.written = append(f.written, id)
	f.writes++
	if f.loseOnce[id] > 0 {
		f.loseOnce[id]--
		return nil, fmt.Errorf("read tcp 127.0.0.1:1->127.0.0.1:2: %w", context.DeadlineExceeded)
	}
	return &dynamodb.TransactWriteItemsOutput{}, nil
}

// DescribeTable answers the uplink's probe after a write that got no
// answer.
func (f *recordingDB) DescribeTable(context.Context, *dynamodb.DescribeTableInput, ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error) {
	return &dynamodb.DescribeTableOutput{}, nil
}

func (f *recordingDB) BatchGetItem(_ context.Context, in *dynamodb.BatchGetItemInput, _ ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gets++
	out := &dynamodb.BatchGetItemOutput{Responses: map[string][]map[string]types.AttributeValue{}}
	for table, ka := range in.RequestItems {
		if !aws.ToBool(ka.ConsistentRead) {
			return nil, errors.New("markers must be read consistently")
		}
		keys := ka.Keys
		if f.unprocessedGets > 0 && len(keys) > 1 {
			// DynamoDB answers part of the keys and returns the rest.
			f.unprocessedGets--
			out.UnprocessedKeys = map[string]types.KeysAndAttributes{table: {Keys: keys[len(keys)/2:], ConsistentRead: ka.ConsistentRead}}
			keys = keys[:len(keys)/2]
		}
		for _, k := range keys {
			if slices.Contains(f.written, k["batch_id"].(*types.AttributeValueMemberS).Value) {
				out.Responses[table] = append(out.Responses[table], map[string]types.AttributeValue{"batch_id": k["batch_id"]})
			}
		}
	}
	return out, nil
}

func (f *recordingDB) order() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.written)
}

// runUntilEmpty runs up until the buffer is empty and the last round has
// reported the uplink up, then stops it.
func runUntilEmpty(t *testing.T, up *uplink.Uplink, buf *buffer.Buffer) {
	t.Helper()
	runUntil(t, up, func() bool { return buf.Stats().PendingBatches == 0 })
}

// runUntil runs up and its Sync until done holds and the last round has
// succeeded.
func runUntil(t *testing.T, up *uplink.Uplink, done func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 2)
	go func() { errs <- up.Run(ctx) }()
	go func() { errs <- up.Sync().Run(ctx) }()
	require.Eventually(t, done, 60*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return up.Status().Up }, 10*time.Second, 5*time.Millisecond)
	cancel()
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
}

// perDevice returns, for each device, its batch_ids in the order of ids.
func perDevice(ids []string) map[string][]string {
	out := map[string][]string{}
	for _, id := range ids {
		hw := id[:17]
		out[hw] = append(out[hw], id)
	}
	return out
}

// seqBatch is the i-th batch of n readings of hw, 10 s apart, the last
// an hour ago.
func seqBatch(t testing.TB, hw string, i, n int) *contract.Batch {
	t.Helper()
	boot := "5f1c2a9e-0000-4000-8000-000000000001"
	end := time.Now().Add(-4*time.Hour).UnixMilli() + int64(i)*10_000
	var readings []map[string]any
	for k := range n {
		readings = append(readings, map[string]any{
			"timestamp_ms": end - int64(n-1-k)*1000, "sensors": map[string]any{"bme280_temp_c": 21.5},
			"sensor_status": map[string]string{"bme280": "ok"},
		})
	}
	raw, err := json.Marshal(map[string]any{
		"batch_id": fmt.Sprintf("%s_%s_%d_%d", hw, boot, end-int64(n)*1000, end), "hardware_id": hw, "boot_id": boot,
		"firmware_version": "1.0.16", "readings": readings,
	})
	require.NoError(t, err)
	b, err := contract.DecodeBatch(raw, hw, contract.DefaultLimits(), time.Now())
	require.NoError(t, err)
	return b
}

func openBuffer(t *testing.T) *buffer.Buffer {
	t.Helper()
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	t.Cleanup(func() { buf.Close() })
	return buf
}

func TestThrottlingHalvesConcurrencyAndSuccessRestoresIt(t *testing.T) {
	buf := openBuffer(t)
	var batches []*contract.Batch
	want := map[string][]string{}
	for w := range 60 {
		for d := range 4 {
			b := seqBatch(t, fmt.Sprintf("EE:00:00:00:00:%02X", d), w, 1)
			batches = append(batches, b)
			want[b.HardwareID] = append(want[b.HardwareID], b.BatchID)
		}
	}
	store(t, buf, batches...)
	reg := prometheus.NewRegistry()
	// Round trips long enough that the scheduler's jitter does not read
	// as queueing (the limit also follows round trips).
	db := &recordingDB{throttle: 40, latency: 20 * time.Millisecond}
	var (
		mu          sync.Mutex
		concurrency []float64 // the gauge at each write
	)
	db.onWrite = func() {
		v := metricValue(reg, "gateway_uplink_concurrency", "")
		mu.Lock()
		concurrency = append(concurrency, v)
		mu.Unlock()
	}
	up, err := uplink.New(uplink.Config{WriteMode: "transaction", TransactionMaxItems: 10, Concurrency: 4, MaxConcurrency: 8, LeaseBatches: 64,
		MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}, uplink.Deps{Store: buf, DynamoDB: db, Tables: cloud.TableNames(""), Registerer: reg})
	require.NoError(t, err)
	runUntilEmpty(t, up, buf)

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 4.0, concurrency[0], "starts at uplink.concurrency")
	require.Equal(t, 1.0, slices.Min(concurrency), "throttling halved it down to 1")
	require.Equal(t, 8.0, metricValue(reg, "gateway_uplink_concurrency", ""), "successes brought it up to uplink.max_concurrency")
	require.Equal(t, 8, up.Report().Concurrency)
	require.LessOrEqual(t, db.maxFlight, 8)
	require.Equal(t, want, perDevice(db.order()), "each device's batches in order, each once")
	require.Equal(t, 240.0, metricValue(reg, "gateway_uplink_batches_total", "delivered"))
}

func TestFreshBatchesAreNotHeldBehindOtherDevicesBacklog(t *testing.T) {
	buf := openBuffer(t)
	want := map[string][]string{}
	var backlog []*contract.Batch
	for w := range 300 {
		for _, hw := range []string{"EE:00:00:00:01:01", "EE:00:00:00:01:02"} {
			b := seqBatch(t, hw, w, 1)
			backlog = append(backlog, b)
			want[hw] = append(want[hw], b.BatchID)
		}
	}
	store(t, buf, backlog...)
	live := "EE:00:00:00:01:03"
	var fresh []*contract.Batch
	for w := range 2 {
		b := seqBatch(t, live, w, 1)
		fresh = append(fresh, b)
		want[live] = append(want[live], b.BatchID)
	}
	store(t, buf, fresh...)

	db := &recordingDB{}
	reg := prometheus.NewRegistry()
	up, err := uplink.New(uplink.Config{WriteMode: "transaction", TransactionMaxItems: 10, LeaseBatches: 64, FreshReserve: 8}, uplink.Deps{Store: buf, DynamoDB: db, Tables: cloud.TableNames(""), Registerer: reg})
	require.NoError(t, err)
	runUntilEmpty(t, up, buf)

	order := db.order()
	require.Len(t, order, 602)
	require.Equal(t, want, perDevice(order), "each device's batches in order, each once")
	// A round is 56 batches of the backlog plus the fresh reserve: the live
	// device's first batch goes in the first round, its second in the
	// second, not after 600 batches of backlog.
	require.Less(t, slices.Index(order, fresh[0].BatchID), 57)
	require.Less(t, slices.Index(order, fresh[1].BatchID), 2*57)
	require.Equal(t, 2.0, metricValue(reg, "gateway_uplink_fresh_batches_total", ""))
}

func TestAmbiguousFailureIsCheckedBeforeTheBatchIsWrittenAgain(t *testing.T) {
	buf := openBuffer(t)
	hw := "EE:00:00:00:02:01"
	b1, b2 := testBatch(t, hw, 0, 2), testBatch(t, hw, 1, 2)
	store(t, buf, b1, b2)
	// b1's write is applied but its answer times out.
	db := &recordingDB{loseOnce: map[string]int{b1.BatchID: 1}}
	reg := prometheus.NewRegistry()
	up, err := uplink.New(uplink.Config{WriteMode: "transaction", TransactionMaxItems: 10, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}, uplink.Deps{Store: buf, DynamoDB: db, Tables: cloud.TableNames(""), Registerer: reg})
	require.NoError(t, err)
	runUntilEmpty(t, up, buf)

	require.Equal(t, []string{b1.BatchID, b2.BatchID}, db.order(), "b1 written once, then b2")
	require.Equal(t, 1.0, metricValue(reg, "gateway_uplink_batches_total", "already_delivered"), "b1, found by its marker")
	require.Equal(t, 1.0, metricValue(reg, "gateway_uplink_batches_total", "delivered"))
	require.Equal(t, 4.0, metricValue(reg, "gateway_uplink_readings_total", ""))
	db.mu.Lock()
	require.Equal(t, 2, db.gets, "one lookup at start, one for b1 after the timeout")
	require.Equal(t, 1, db.attempts[b1.BatchID], "b1 not sent again")
	db.mu.Unlock()
}

func TestReportKeepsTheLastErrorAndTellsTheDrain(t *testing.T) {
	buf := openBuffer(t)
	var batches []*contract.Batch
	for w := range 20 {
		batches = append(batches, testBatch(t, "EE:00:00:00:03:01", w, 1))
	}
	store(t, buf, batches...)
	db := &recordingDB{failOnce: 3}
	reg := prometheus.NewRegistry()
	up, err := uplink.New(uplink.Config{WriteMode: "transaction", TransactionMaxItems: 10, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}, uplink.Deps{Store: buf, DynamoDB: db, Tables: cloud.TableNames(""), Registerer: reg})
	require.NoError(t, err)

	r := up.Report()
	require.Zero(t, metricValue(reg, "gateway_uplink_last_delivery_timestamp_seconds", ""), "nothing delivered yet")
	require.Equal(t, "up", r.State)
	require.EqualValues(t, 20, r.BacklogBatches)
	require.Nil(t, r.ETASeconds, "a backlog and no delivery yet: no estimate")
	require.Nil(t, r.LastDeliveryAt)
	require.Empty(t, r.LastError)

	runUntilEmpty(t, up, buf)
	r = up.Report()
	require.Equal(t, "up", r.State)
	require.Zero(t, r.FailedRounds)
	require.Contains(t, r.LastError, "connection reset by peer", "kept after recovery")
	require.NotNil(t, r.LastErrorAt)
	require.NotNil(t, r.LastDeliveryAt)
	require.False(t, r.LastDeliveryAt.Before(*r.LastErrorAt), "delivered after the last failure")
	require.InDelta(t, float64(r.LastDeliveryAt.UnixNano())/1e9,
		metricValue(reg, "gateway_uplink_last_delivery_timestamp_seconds", ""), 1e-6, "the gauge tells the report's last delivery")
	require.Positive(t, r.DrainRateBatches)
	require.Zero(t, r.BacklogBatches)
	require.NotNil(t, r.ETASeconds)
	require.Zero(t, *r.ETASeconds, "nothing left to drain")

	raw, err := json.Marshal(r)
	require.NoError(t, err)
	var fields map[string]any
	require.NoError(t, json.Unmarshal(raw, &fields))
	for _, k := range []string{"state", "since", "backlog_batches", "backlog_bytes", "oldest_age_seconds",
		"drain_rate_batches_per_second", "eta_seconds", "last_error", "last_error_at", "failed_rounds",
		"last_delivery_at", "arrival_rate_batches_per_second", "concurrency"} {
		require.Contains(t, fields, k)
	}
}

// countingDB counts the writes that reach DynamoDB.
type countingDB struct {
	uplink.DynamoDB
	mu     sync.Mutex
	writes map[string]int
}

func (c *countingDB) count(op string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writes[op]++
}

func (c *countingDB) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, o ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	c.count("TransactWriteItems")
	return c.DynamoDB.TransactWriteItems(ctx, in, o...)
}

func (c *countingDB) BatchWriteItem(ctx context.Context, in *dynamodb.BatchWriteItemInput, o ...func(*dynamodb.Options)) (*dynamodb.BatchWriteItemOutput, error) {
	c.count("BatchWriteItem")
	return c.DynamoDB.BatchWriteItem(ctx, in, o...)
}

func (c *countingDB) PutItem(ctx context.Context, in *dynamodb.PutItemInput, o ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	c.count("PutItem")
	return c.DynamoDB.PutItem(ctx, in, o...)
}

func (c *countingDB) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	c.count("BatchGetItem")
	return c.DynamoDB.BatchGetItem(ctx, in, o...)
}

func TestBatchWhoseMarkerExistsIsNotWrittenAgainAfterARestart(t *testing.T) {
	for _, mode := range []string{"transaction", "batch"} {
		t.Run(mode, func(t *testing.T) {
			local := dynamotest.Shared(t)
			tables := local.NewTables(t)
			client := local.Client(t)
			buf := openBuffer(t)
			hw := "EE:00:00:00:04:01"
			if mode == "batch" {
				hw = "EE:00:00:00:04:02"
			}
			var batches []*contract.Batch
			for w := range 150 { // more than one BatchGetItem of 100 keys
				batches = append(batches, seqBatch(t, hw, w, 1+w%3))
			}
			store(t, buf, batches...)
			// A run that crashed had delivered the first 120 (and written
			// their markers) without recording it in the buffer. Here the
			// markers alone stand for those deliveries, so a rewrite would
			// show as readings.
			var markers []types.WriteRequest
			flush := func() {
				_, err := client.BatchWriteItem(context.Background(), &dynamodb.BatchWriteItemInput{
					RequestItems: map[string][]types.WriteRequest{tables.ProcessedBatches: markers}})
				require.NoError(t, err)
				markers = nil
			}
			// One of them, though, is in the cloud with another payload:
			// a conflict, not a delivery.
			const conflict = 5
			for i, b := range batches[:120] {
				m := map[string]types.AttributeValue{
					"batch_id": &types.AttributeValueMemberS{Value: b.BatchID}, "hardware_id": &types.AttributeValueMemberS{Value: hw},
					"received_at": &types.AttributeValueMemberS{Value: "2026-01-15T14:22:00Z"}, "expiration_time": &types.AttributeValueMemberN{Value: "1"},
				}
				if i == conflict {
					m["payload_hash"] = &types.AttributeValueMemberS{Value: "00"}
				}
				markers = append(markers, types.WriteRequest{PutRequest: &types.PutRequest{Item: m}})
				if len(markers) == 25 {
					flush()
				}
			}
			if len(markers) > 0 {
				flush()
			}
			db := &countingDB{DynamoDB: client, writes: map[string]int{}}
			reg := prometheus.NewRegistry()
			up, err := uplink.New(uplink.Config{WriteMode: mode, TransactionMaxItems: 10, LeaseBatches: 256}, uplink.Deps{Store: buf, DynamoDB: db, Tables: tables, Registerer: reg})
			require.NoError(t, err)
			runUntilEmpty(t, up, buf)

			e := &env{client: client, tables: tables}
			want := 0
			for _, b := range batches[120:] {
				want += len(b.Readings)
			}
			require.Len(t, e.readings(t, hw), want, "only the 30 batches without a marker were written")
			require.Equal(t, 119.0, metricValue(reg, "gateway_uplink_batches_total", "already_delivered"))
			require.Equal(t, 30.0, metricValue(reg, "gateway_uplink_batches_total", "delivered"))
			require.Equal(t, 1.0, metricValue(reg, "gateway_uplink_batches_total", "dead_lettered"))
			db.mu.Lock()
			if mode == "transaction" {
				// The conflicting batch's transaction is cancelled by its
				// marker, which is then read for its payload hash.
				require.Equal(t, 3, db.writes["BatchGetItem"], "150 markers looked up in requests of at most 100, and the conflict's")
				require.Equal(t, 31, db.writes["TransactWriteItems"])
			} else {
				require.Equal(t, 2, db.writes["BatchGetItem"], "150 markers looked up in requests of at most 100")
				require.Zero(t, db.writes["PutItem"], "markers go in BatchWriteItem requests")
				require.Zero(t, db.writes["TransactWriteItems"])
			}
			db.mu.Unlock()
			for _, b := range batches[120:] {
				m := e.marker(t, b.BatchID)
				require.NotEmpty(t, m, "marker of %s", b.BatchID)
				require.Equal(t, hex.EncodeToString(func() []byte { h := b.IdentityHash(); return h[:] }()), str(t, m, "payload_hash"))
			}
			for i, b := range batches[:120] {
				require.Equal(t, "2026-01-15T14:22:00Z", str(t, e.marker(t, b.BatchID), "received_at"))
				state, err := buf.Lookup(b.BatchID)
				require.NoError(t, err)
				if i == conflict {
					require.Equal(t, "dead", state, "another payload under its batch_id")
					continue
				}
				require.Equal(t, "delivered", state)
			}
		})
	}
}

func TestFreshBatchQueuedBeforeAStartIsCheckedFirst(t *testing.T) {
	buf := openBuffer(t)
	var backlog []*contract.Batch
	for w := range 100 {
		backlog = append(backlog, seqBatch(t, "EE:00:00:00:05:01", w, 1))
	}
	store(t, buf, backlog...)
	b, c := seqBatch(t, "EE:00:00:00:05:02", 0, 1), seqBatch(t, "EE:00:00:00:05:03", 0, 1)
	store(t, buf, b, c)
	// The run before the start sent b as a fresh batch and crashed before
	// recording it.
	db := &recordingDB{written: []string{b.BatchID}}
	reg := prometheus.NewRegistry()
	up, err := uplink.New(uplink.Config{WriteMode: "transaction", TransactionMaxItems: 10, LeaseBatches: 16, FreshReserve: 1}, uplink.Deps{Store: buf, DynamoDB: db, Tables: cloud.TableNames(""), Registerer: reg})
	require.NoError(t, err)
	runUntilEmpty(t, up, buf)

	order := db.order()
	require.Len(t, order, 102)
	db.mu.Lock()
	require.Equal(t, 101, db.writes)
	require.Zero(t, db.attempts[b.BatchID], "b not sent again")
	db.mu.Unlock()
	require.Less(t, slices.Index(order, c.BatchID), 1+16, "c, the newest head, went in the first round")
	require.Equal(t, 1.0, metricValue(reg, "gateway_uplink_batches_total", "already_delivered"))
	require.Equal(t, 101.0, metricValue(reg, "gateway_uplink_batches_total", "delivered"))
	state, err := buf.Lookup(b.BatchID)
	require.NoError(t, err)
	require.Equal(t, "delivered", state)
}

func TestMarkerLookupResendsUnprocessedKeys(t *testing.T) {
	buf := openBuffer(t)
	var batches []*contract.Batch
	for w := range 40 {
		batches = append(batches, seqBatch(t, "EE:00:00:00:06:01", w, 1))
	}
	store(t, buf, batches...)
	// A crashed run had written the first 30.
	var written []string
	for _, b := range batches[:30] {
		written = append(written, b.BatchID)
	}
	db := &recordingDB{written: written, unprocessedGets: 2}
	reg := prometheus.NewRegistry()
	up, err := uplink.New(uplink.Config{WriteMode: "transaction", TransactionMaxItems: 10}, uplink.Deps{Store: buf, DynamoDB: db, Tables: cloud.TableNames(""), Registerer: reg})
	require.NoError(t, err)
	runUntilEmpty(t, up, buf)

	require.Equal(t, 30.0, metricValue(reg, "gateway_uplink_batches_total", "already_delivered"))
	require.Equal(t, 10.0, metricValue(reg, "gateway_uplink_batches_total", "delivered"))
	db.mu.Lock()
	defer db.mu.Unlock()
	require.Equal(t, 3, db.gets, "40 keys: 20 answered, then 10, then the last 10")
	for _, b := range batches[:30] {
		require.Zero(t, db.attempts[b.BatchID], "%s not sent again", b.BatchID)
	}
}
