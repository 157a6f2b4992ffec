//go:build linux

package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"greenhouse-gateway/internal/cloud"
)

// plainRun is one run of the plain writer: the backlog's readings, with
// each batch's processed_batches marker after them (the same items
// gatewayd writes) or without markers, 25 items to a BatchWriteItem, no
// conditions, from goroutines taking the next request off a shared counter.
type plainRun struct {
	Goroutines int  `json:"goroutines"`
	Markers    bool `json:"with_markers"`
	// Readings are the readings written, Items every item (the markers
	// too).
	Readings    int     `json:"readings"`
	Items       int     `json:"items"`
	Requests    int64   `json:"requests"`
	Unprocessed int64   `json:"unprocessed_items"`
	Seconds     float64 `json:"seconds"`
	// DynamoCPU is DynamoDB Local's CPU time during the run, ClientCPU the
	// benchmark process's (the writer).
	DynamoCPU float64 `json:"dynamodb_local_cpu_s"`
	ClientCPU float64 `json:"cpu_s"`
	// WCU is what DynamoDB reported consumed when the writer asked
	// (WCUReported), otherwise computed from the items' sizes.
	WCU         float64 `json:"wcu"`
	WCUReported bool    `json:"wcu_reported"`
	// Stored and MarkersStored are what the tables hold after the run.
	Stored        int64 `json:"readings_in_table"`
	MarkersStored int64 `json:"markers_in_table"`
}

func (p plainRun) rate() float64 {
	if p.Seconds <= 0 {
		return 0
	}
	return float64(p.Readings) / p.Seconds
}

// plainCeiling is the fastest plain writer of a backlog and every run
// tried.
type plainCeiling struct {
	Best plainRun   `json:"best"`
	Runs []plainRun `json:"runs"`
}

// bestPlain returns the run with the highest rate; on a tie, the one with
// fewer goroutines.
func bestPlain(runs []plainRun) plainRun {
	var best plainRun
	for _, r := range runs {
		if r.rate() > best.rate() || (r.rate() == best.rate() && r.Goroutines < best.Goroutines) {
			best = r
		}
	}
	return best
}

// plainRequests packs the batches' readings, in order, each batch's
// marker after them with markers, 25 items to a BatchWriteItem across the
// tables. With encoded (a client that takes them: cloud.EncodesItems) each
// reading is given encoded (cloud.EncodedItem), as gatewayd sends it, and
// encoded here, before the writer's clock starts: the writer only sends.
func plainRequests(items []*itemBatch, tables cloud.Tables, markers, encoded bool) []map[string][]types.WriteRequest {
	var out []map[string][]types.WriteRequest
	cur, n := map[string][]types.WriteRequest{}, 0
	add := func(table string, item map[string]types.AttributeValue) {
		cur[table] = append(cur[table], types.WriteRequest{PutRequest: &types.PutRequest{Item: item}})
		if n++; n == 25 {
			out = append(out, cur)
			cur, n = map[string][]types.WriteRequest{}, 0
		}
	}
	for _, ib := range items {
		if encoded {
			for _, raw := range ib.built.Encode() {
				add(tables.Readings, cloud.EncodedItem(raw))
			}
		} else {
			for _, rd := range ib.readings {
				add(tables.Readings, rd)
			}
		}
		if markers {
			add(tables.ProcessedBatches, ib.marker)
		}
	}
	if n > 0 {
		out = append(out, cur)
	}
	return out
}

// ceiling runs the plain writer over items with each of the configured
// goroutine counts (--ceiling-goroutines), each into fresh tables, and
// keeps the fastest. The writer asks for the consumed capacity only when
// gatewayd does (uplink.consumed_capacity): DynamoDB Local spends more CPU
// on requests that ask, and its CPU per reading is compared.
func (r *runner) ceiling(ctx context.Context, items []*itemBatch, pricing itemPricing) (plainCeiling, error) {
	var c plainCeiling
	for _, g := range r.cfg.CeilingGoroutines {
		run, err := r.plainAt(ctx, r.dynamo.client, items, true, pricing, g)
		if err != nil {
			return c, err
		}
		c.Runs = append(c.Runs, run)
	}
	c.Best = bestPlain(c.Runs)
	return c, nil
}

// plainAt runs the plain writer with g goroutines on items, with their
// markers or without, through client, into fresh tables, and checks that
// the tables hold every item.
func (r *runner) plainAt(ctx context.Context, client *dynamodb.Client, items []*itemBatch, markers bool, pricing itemPricing, g int) (plainRun, error) {
	_, tables, err := newTables(ctx, r.dynamo.client, false)
	if err != nil {
		return plainRun{}, err
	}
	reqs := plainRequests(items, tables, markers, cloud.EncodesItems(client))
	r.log.Info("drain: plain writer", "goroutines", g, "markers", markers, "requests", len(reqs), "consumed_capacity", r.consumedCapacity())
	run, err := r.plainWrite(ctx, client, reqs, g, r.consumedCapacity())
	run.Markers = markers
	for _, ib := range items {
		run.Readings += len(ib.readings)
	}
	batches := 0
	if markers {
		batches = len(items)
	}
	if err == nil {
		run.Stored, err = countItems(ctx, r.dynamo.client, tables.Readings)
	}
	if err == nil && markers {
		run.MarkersStored, err = countItems(ctx, r.dynamo.client, tables.ProcessedBatches)
	}
	if err = errors.Join(err, dropTables(ctx, r.dynamo.client, tables)); err != nil {
		return run, err
	}
	if run.Stored != int64(run.Readings) || run.MarkersStored != int64(batches) || run.Items != run.Readings+batches {
		return run, fmt.Errorf("plain writer, %d goroutines: wrote %d items for %d readings and %d markers, the tables hold %d and %d",
			g, run.Items, run.Readings, batches, run.Stored, run.MarkersStored)
	}
	if !run.WCUReported {
		run.WCU = float64(int64(run.Readings)+run.Unprocessed)*pricing.ReadingWCU + float64(batches)*pricing.MarkerWCU
	}
	return run, nil
}

// plainWrite sends reqs (BatchWriteItem's RequestItems) through client
// with g goroutines, resending what DynamoDB leaves unprocessed (at most
// 10 times per request); with consumed, it asks for the consumed capacity
// (TOTAL) and sums it. Its Items are the items written; the caller counts
// the readings.
func (r *runner) plainWrite(ctx context.Context, client *dynamodb.Client, reqs []map[string][]types.WriteRequest, g int, consumed bool) (plainRun, error) {
	ask := types.ReturnConsumedCapacityNone
	if consumed {
		ask = types.ReturnConsumedCapacityTotal
	}
	run := plainRun{Goroutines: g}
	var (
		next, requests, unprocessed, written atomic.Int64
		wg                                   sync.WaitGroup
		mu                                   sync.Mutex
		firstErr                             error
		units                                float64
		reported                             bool
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr == nil {
			firstErr = err
		}
	}
	dyn, self := &cpuMark{pid: r.dynamo.proc.Pid()}, &cpuMark{pid: os.Getpid()}
	cpu := dyn.hooks(self.hooks())
	cpu.start()
	start := time.Now()
	for range g {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(len(reqs)) {
					return
				}
				rq := reqs[i]
				written.Add(int64(countWrites(rq)))
				for attempt := 0; len(rq) > 0; attempt++ {
					if attempt == 10 {
						fail(fmt.Errorf("plain writer: %d items still unprocessed", countWrites(rq)))
						return
					}
					requests.Add(1)
					out, err := client.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{
						RequestItems: rq, ReturnConsumedCapacity: ask})
					if err != nil {
						fail(fmt.Errorf("plain writer: %w", err))
						return
					}
					if len(out.ConsumedCapacity) > 0 {
						mu.Lock()
						for _, cc := range out.ConsumedCapacity {
							units += aws.ToFloat64(cc.CapacityUnits)
						}
						reported = true
						mu.Unlock()
					}
					rq = out.UnprocessedItems
					unprocessed.Add(int64(countWrites(rq)))
				}
			}
		})
	}
	wg.Wait()
	run.Seconds = time.Since(start).Seconds()
	cpu.end()
	if err := errors.Join(dyn.err, self.err); err != nil {
		return run, err
	}
	run.DynamoCPU, run.ClientCPU = dyn.seconds(), self.seconds()
	run.Items, run.Requests, run.Unprocessed = int(written.Load()), requests.Load(), unprocessed.Load()
	if reported {
		run.WCU, run.WCUReported = units, true
	}
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return run, firstErr
}

// countWrites is the write requests of a BatchWriteItem's RequestItems.
func countWrites(items map[string][]types.WriteRequest) int {
	n := 0
	for _, w := range items {
		n += len(w)
	}
	return n
}

// consumedCapacity reports whether gatewayd asks DynamoDB for the consumed
// capacity (uplink.consumed_capacity, set with --gateway-env).
func (r *runner) consumedCapacity() bool {
	on := false
	for _, kv := range r.cfg.GatewayEnv {
		if v, ok := strings.CutPrefix(kv, "GATEWAY_UPLINK_CONSUMED_CAPACITY="); ok {
			on, _ = strconv.ParseBool(v)
		}
	}
	return on
}

// joinCounts is counts joined with commas.
func joinCounts(counts []int) string {
	s := make([]string, len(counts))
	for i, n := range counts {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}
