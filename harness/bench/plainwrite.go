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

// plainRun is one run of the plain writer: the backlog's readings, 25 to
// a BatchWriteItem, no markers, no conditions, from goroutines taking the
// next request off a shared counter.
type plainRun struct {
	Goroutines  int     `json:"goroutines"`
	Readings    int     `json:"readings"`
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
	// Stored is the readings the table holds after the run.
	Stored int64 `json:"readings_in_table"`
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

// plainRequests packs the batches' readings, in order, 25 to a request.
// With encoded (a client that takes them: cloud.EncodesItems) each reading
// is given encoded (cloud.EncodedItem), as gatewayd sends it, and encoded
// here, before the writer's clock starts: the writer only sends.
func plainRequests(items []*itemBatch, encoded bool) [][]types.WriteRequest {
	var out [][]types.WriteRequest
	var cur []types.WriteRequest
	for _, ib := range items {
		readings := ib.readings
		if encoded {
			readings = readings[:0:0]
			for _, raw := range ib.built.Encode() {
				readings = append(readings, cloud.EncodedItem(raw))
			}
		}
		for _, r := range readings {
			cur = append(cur, types.WriteRequest{PutRequest: &types.PutRequest{Item: r}})
			if len(cur) == 25 {
				out = append(out, cur)
				cur = nil
			}
		}
	}
	if len(cur) > 0 {
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
	reqs := plainRequests(items, cloud.EncodesItems(r.dynamo.client))
	for _, g := range r.cfg.CeilingGoroutines {
		run, err := r.plainAt(ctx, r.dynamo.client, reqs, pricing, g)
		if err != nil {
			return c, err
		}
		c.Runs = append(c.Runs, run)
	}
	c.Best = bestPlain(c.Runs)
	return c, nil
}

// plainAt runs the plain writer with g goroutines on reqs
// (plainRequests), through client, into fresh tables, and checks that the
// table holds every reading.
func (r *runner) plainAt(ctx context.Context, client *dynamodb.Client, reqs [][]types.WriteRequest, pricing itemPricing, g int) (plainRun, error) {
	_, tables, err := newTables(ctx, r.dynamo.client, false)
	if err != nil {
		return plainRun{}, err
	}
	r.log.Info("drain: plain writer", "goroutines", g, "requests", len(reqs), "consumed_capacity", r.consumedCapacity())
	toTable := make([]map[string][]types.WriteRequest, len(reqs))
	for i, rq := range reqs {
		toTable[i] = map[string][]types.WriteRequest{tables.Readings: rq}
	}
	run, err := r.plainWrite(ctx, client, toTable, g, r.consumedCapacity())
	if err == nil {
		run.Stored, err = countItems(ctx, r.dynamo.client, tables.Readings)
	}
	if err = errors.Join(err, dropTables(ctx, r.dynamo.client, tables)); err != nil {
		return run, err
	}
	if run.Stored != int64(run.Readings) {
		return run, fmt.Errorf("plain writer, %d goroutines: wrote %d readings, the table holds %d", g, run.Readings, run.Stored)
	}
	if !run.WCUReported {
		run.WCU = float64(int64(run.Readings)+run.Unprocessed) * pricing.ReadingWCU
	}
	return run, nil
}

// plainWrite sends reqs (BatchWriteItem's RequestItems) through client
// with g goroutines, resending what DynamoDB leaves unprocessed (at most
// 10 times per request); with consumed, it asks for the consumed capacity
// (TOTAL) and sums it. Its Readings are the items written.
func (r *runner) plainWrite(ctx context.Context, client *dynamodb.Client, reqs []map[string][]types.WriteRequest, g int, consumed bool) (plainRun, error) {
	ask := types.ReturnConsumedCapacityNone
	if consumed {
		ask = types.ReturnConsumedCapacityTotal
	}
	run := plainRun{Goroutines: g}
	var (
		next, requests, unprocessed, readings atomic.Int64
		wg                                    sync.WaitGroup
		mu                                    sync.Mutex
		firstErr                              error
		units                                 float64
		reported                              bool
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
				readings.Add(int64(countWrites(rq)))
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
	run.Readings, run.Requests, run.Unprocessed = int(readings.Load()), requests.Load(), unprocessed.Load()
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
