//go:build linux

package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"greenhouse-gateway/internal/cloud"
)

// markerCondition is the uplink's condition on a processed_batches marker.
const markerCondition = "attribute_not_exists(batch_id)"

// sdkAttempts bounds the attempts of one request of the SDK loop.
const sdkAttempts = 5

// newTables creates the four tables under a fresh prefix, with the schema's
// TTL settings when ttl is set. Without them DynamoDB Local skips its TTL
// sweeps, which compete with the writes for its throughput (on AWS, TTL
// deletes are free and asynchronous): the drain's tables have none, for
// both gatewayd and its baseline.
func newTables(ctx context.Context, client *dynamodb.Client, ttl bool) (string, cloud.Tables, error) {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	prefix := "bench" + hex.EncodeToString(b) + "_"
	tables := cloud.TableNames(prefix)
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if ttl {
		if err := cloud.CreateTables(cctx, client, tables, nil); err != nil {
			return "", cloud.Tables{}, fmt.Errorf("creating tables %s*: %w", prefix, err)
		}
		return prefix, tables, nil
	}
	defs := cloud.TableDefinitions(tables)
	for _, def := range defs {
		if _, err := client.CreateTable(cctx, def); err != nil {
			return "", cloud.Tables{}, fmt.Errorf("creating table %s: %w", aws.ToString(def.TableName), err)
		}
	}
	waiter := dynamodb.NewTableExistsWaiter(client, func(o *dynamodb.TableExistsWaiterOptions) {
		o.MinDelay = 100 * time.Millisecond
	})
	for _, def := range defs {
		if err := waiter.Wait(cctx, &dynamodb.DescribeTableInput{TableName: def.TableName}, time.Minute); err != nil {
			return "", cloud.Tables{}, fmt.Errorf("waiting for table %s: %w", aws.ToString(def.TableName), err)
		}
	}
	return prefix, tables, nil
}

// dropTables deletes the four tables, freeing DynamoDB Local's memory.
func dropTables(ctx context.Context, client *dynamodb.Client, tables cloud.Tables) error {
	var errs []error
	for _, name := range tables.All() {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := client.DeleteTable(cctx, &dynamodb.DeleteTableInput{TableName: aws.String(name)})
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("deleting table %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// countSegments is how many segments of a parallel Scan count a table.
// DynamoDB Local counts faster in parallel segments than their number
// alone explains: one segment counted 100,000 readings in 60 s, four in
// 14 s, sixteen in 5 s.
const countSegments = 16

// countItems counts a table's items with a parallel, paginated Scan
// (Select COUNT) of countSegments segments.
func countItems(ctx context.Context, client *dynamodb.Client, table string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	var (
		total atomic.Int64
		wg    sync.WaitGroup
		errs  = make([]error, countSegments)
	)
	for seg := range countSegments {
		wg.Go(func() {
			p := dynamodb.NewScanPaginator(client, &dynamodb.ScanInput{TableName: aws.String(table), Select: types.SelectCount,
				Segment: aws.Int32(int32(seg)), TotalSegments: aws.Int32(countSegments)})
			for p.HasMorePages() {
				page, err := p.NextPage(ctx)
				if err != nil {
					errs[seg] = fmt.Errorf("counting %s, segment %d: %w", table, seg, err)
					return
				}
				total.Add(int64(page.Count))
			}
		})
	}
	wg.Wait()
	return total.Load(), errors.Join(errs...)
}

// capacityProbe says whether the endpoint returns ConsumedCapacity when
// asked (ReturnConsumedCapacity=TOTAL), per write API, and what.
type capacityProbe struct {
	Returned map[string]bool    `json:"returned"`
	Units    map[string]float64 `json:"capacity_units"`
	Items    map[string]int     `json:"items_written"`
}

// probeCapacity writes a reading item and a marker with each write API of
// the uplink, asking for the consumed capacity. It writes into tables,
// which the caller drops.
func probeCapacity(ctx context.Context, client *dynamodb.Client, tables cloud.Tables, sample *itemBatch) (capacityProbe, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	pr := capacityProbe{Returned: map[string]bool{}, Units: map[string]float64{}, Items: map[string]int{}}
	note := func(op string, items int, cc ...types.ConsumedCapacity) {
		pr.Items[op] = items
		for _, c := range cc {
			pr.Returned[op] = true
			pr.Units[op] += aws.ToFloat64(c.CapacityUnits)
		}
		if _, ok := pr.Returned[op]; !ok {
			pr.Returned[op] = false
		}
	}
	put, err := client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(tables.ProcessedBatches), Item: sample.marker,
		ConditionExpression: aws.String(markerCondition), ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
	})
	if err != nil {
		return pr, fmt.Errorf("probing PutItem: %w", err)
	}
	if put.ConsumedCapacity != nil {
		note("PutItem", 1, *put.ConsumedCapacity)
	} else {
		note("PutItem", 1)
	}
	var reqs []types.WriteRequest
	for _, r := range sample.readings {
		reqs = append(reqs, types.WriteRequest{PutRequest: &types.PutRequest{Item: r}})
	}
	bw, err := client.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{
		RequestItems:           map[string][]types.WriteRequest{tables.Readings: reqs},
		ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
	})
	if err != nil {
		return pr, fmt.Errorf("probing BatchWriteItem: %w", err)
	}
	note("BatchWriteItem", len(reqs), bw.ConsumedCapacity...)
	// A transaction of two readings (overwritten, same keys) and no marker:
	// the probe must not depend on the endpoint's transaction limit.
	tx, err := client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{
		TransactItems: []types.TransactWriteItem{
			{Put: &types.Put{TableName: aws.String(tables.Readings), Item: sample.readings[0]}},
			{Put: &types.Put{TableName: aws.String(tables.Readings), Item: sample.readings[1]}},
		},
		ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
	})
	if err != nil {
		return pr, fmt.Errorf("probing TransactWriteItems: %w", err)
	}
	note("TransactWriteItems", 2, tx.ConsumedCapacity...)
	return pr, nil
}

// sdkResult is what the SDK loop did.
type sdkResult struct {
	Concurrency int              `json:"concurrency"`
	Batches     int              `json:"batches"`
	Readings    int              `json:"readings"`
	Seconds     float64          `json:"seconds"`
	Requests    map[string]int64 `json:"requests"`
	Unprocessed int64            `json:"unprocessed_items"`
	// TxReadings is how many readings went up in transactions.
	TxReadings       int64   `json:"transaction_readings"`
	ConsumedWCU      float64 `json:"consumed_wcu_reported"`
	ConsumedReported bool    `json:"consumed_reported"`
	// ClientCPU is the CPU time of the benchmark process during the loop.
	ClientCPU float64 `json:"cpu_s"`
}

// sdkLoop is the drain's baseline: a minimal loop that writes the same items
// with the same requests as the uplink in write mode mode, with the same
// client settings and concurrency. Each worker takes every concurrency-th
// batch. In "batch" mode it packs their readings 25 to a BatchWriteItem and,
// once all of a batch's readings are written, puts its conditional marker.
// In "transaction" mode it writes each batch as the uplink does: its
// readings and marker in one TransactWriteItems when they fit in txLimit
// actions, otherwise the batch's readings (BatchWriteItem, 25 at a time)
// and then its marker.
func sdkLoop(ctx context.Context, client *dynamodb.Client, tables cloud.Tables, batches []*itemBatch, concurrency int, mode string, txLimit int) (sdkResult, error) {
	res := sdkResult{Concurrency: concurrency, Batches: len(batches), Requests: map[string]int64{}}
	for _, b := range batches {
		res.Readings += len(b.readings)
	}
	var (
		bw, puts, txs, txReadings atomic.Int64
		unprocessed               atomic.Int64
		mu                        sync.Mutex
		consumed                  float64
		reported                  bool
		firstErr                  error
	)
	record := func(cc ...types.ConsumedCapacity) {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range cc {
			reported = true
			consumed += aws.ToFloat64(c.CapacityUnits)
		}
	}
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr == nil {
			firstErr = err
		}
	}
	begin := time.Now()
	var wg sync.WaitGroup
	for w := range concurrency {
		wg.Go(func() {
			var chunk []types.WriteRequest
			var complete []*itemBatch // batches whose last reading is in chunk
			flush := func() error {
				for attempt := 1; len(chunk) > 0; attempt++ {
					if attempt > sdkAttempts {
						return fmt.Errorf("BatchWriteItem: %d items still unprocessed after %d attempts", len(chunk), sdkAttempts)
					}
					bw.Add(1)
					out, err := client.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{
						RequestItems:           map[string][]types.WriteRequest{tables.Readings: chunk},
						ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
					})
					if err != nil {
						if ctx.Err() != nil || attempt == sdkAttempts {
							return fmt.Errorf("BatchWriteItem: %w", err)
						}
						continue
					}
					record(out.ConsumedCapacity...)
					chunk = out.UnprocessedItems[tables.Readings]
					unprocessed.Add(int64(len(chunk)))
				}
				for _, b := range complete {
					if err := putMarker(ctx, client, tables, b, &puts, record); err != nil {
						return err
					}
				}
				complete = complete[:0]
				return nil
			}
			for i := w; i < len(batches); i += concurrency {
				b := batches[i]
				if mode == "transaction" && len(b.readings)+1 <= txLimit {
					if err := transactBatch(ctx, client, tables, b, &txs, record); err != nil {
						fail(err)
						return
					}
					txReadings.Add(int64(len(b.readings)))
					continue
				}
				for _, r := range b.readings {
					if len(chunk) == batchWriteMax {
						if err := flush(); err != nil {
							fail(err)
							return
						}
					}
					chunk = append(chunk, types.WriteRequest{PutRequest: &types.PutRequest{Item: r}})
				}
				complete = append(complete, b)
				if mode == "transaction" {
					// One batch's readings, then its marker: no packing
					// across batches.
					if err := flush(); err != nil {
						fail(err)
						return
					}
				}
			}
			if err := flush(); err != nil {
				fail(err)
			}
		})
	}
	wg.Wait()
	res.Seconds = time.Since(begin).Seconds()
	res.Requests["BatchWriteItem"] = bw.Load()
	res.Requests["PutItem"] = puts.Load()
	if n := txs.Load(); n > 0 {
		res.Requests["TransactWriteItems"] = n
	}
	res.Unprocessed = unprocessed.Load()
	res.TxReadings = txReadings.Load()
	res.ConsumedWCU, res.ConsumedReported = consumed, reported
	return res, firstErr
}

// transactBatch writes a batch's readings and its conditional marker in
// one TransactWriteItems; a cancellation on the marker alone means an
// earlier attempt wrote it.
func transactBatch(ctx context.Context, client *dynamodb.Client, tables cloud.Tables, b *itemBatch, txs *atomic.Int64, record func(...types.ConsumedCapacity)) error {
	items := make([]types.TransactWriteItem, 0, len(b.readings)+1)
	for _, r := range b.readings {
		items = append(items, types.TransactWriteItem{Put: &types.Put{TableName: aws.String(tables.Readings), Item: r}})
	}
	items = append(items, types.TransactWriteItem{Put: &types.Put{
		TableName: aws.String(tables.ProcessedBatches), Item: b.marker,
		ConditionExpression: aws.String(markerCondition),
	}})
	for attempt := 1; ; attempt++ {
		txs.Add(1)
		out, err := client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{
			TransactItems: items, ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
		})
		var tce *types.TransactionCanceledException
		switch {
		case err == nil:
			record(out.ConsumedCapacity...)
			return nil
		case attempt > 1 && errors.As(err, &tce):
			return nil // written by an earlier attempt
		case ctx.Err() != nil || attempt == sdkAttempts:
			return fmt.Errorf("TransactWriteItems: %w", err)
		}
	}
}

// batchWriteMax is BatchWriteItem's item limit.
const batchWriteMax = 25

func putMarker(ctx context.Context, client *dynamodb.Client, tables cloud.Tables, b *itemBatch, puts *atomic.Int64, record func(...types.ConsumedCapacity)) error {
	for attempt := 1; ; attempt++ {
		puts.Add(1)
		out, err := client.PutItem(ctx, &dynamodb.PutItemInput{
			TableName: aws.String(tables.ProcessedBatches), Item: b.marker,
			ConditionExpression: aws.String(markerCondition), ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
		})
		var ccf *types.ConditionalCheckFailedException
		switch {
		case err == nil:
			if out.ConsumedCapacity != nil {
				record(*out.ConsumedCapacity)
			}
			return nil
		case errors.As(err, &ccf):
			return nil // written by an earlier attempt
		case ctx.Err() != nil || attempt == sdkAttempts:
			return fmt.Errorf("PutItem: %w", err)
		}
	}
}
