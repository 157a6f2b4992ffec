//go:build linux

package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/tablewrite"
)

// Write modes of the uplink (uplink.write_mode).
var writeModes = []string{"transaction", "batch"}

// drainPoll is how often the drain reads gatewayd's memory (from /proc),
// drainScrape how often its metrics: a scrape costs gatewayd CPU the plain
// writer does not pay, and the drain's end is timed by gatewayd itself
// (gateway_uplink_last_delivery_timestamp_seconds), not by the scrape that
// finds nothing pending.
const (
	drainPoll   = 100 * time.Millisecond
	drainScrape = time.Second
)

// gatewayDrain is what gatewayd did in one drain.
type gatewayDrain struct {
	Mode         string  `json:"write_mode"`
	ReadySeconds float64 `json:"ready_s"`
	// Seconds runs from ready to the last delivery.
	Seconds       float64            `json:"seconds"`
	Readings      float64            `json:"readings"`
	Markers       float64            `json:"markers"`
	Requests      map[string]float64 `json:"requests"`
	BatchItems    float64            `json:"batch_write_items"`
	Unprocessed   float64            `json:"unprocessed_items"`
	RequestErrors float64            `json:"request_errors"`
	ErrorsByKind  map[string]float64 `json:"request_errors_by_series,omitempty"`
	// Progress is the readings forwarded since ready, every few seconds.
	Progress   []progress `json:"progress"`
	TxLimit    float64    `json:"transaction_max_items"`
	WCU        float64    `json:"wcu"`
	MaxRSS     int64      `json:"max_vm_rss_bytes"`
	HWM        int64      `json:"vm_hwm_bytes"`
	CPUSeconds float64    `json:"cpu_s"`
	// ConsumedWCU is the write units DynamoDB reported consumed by
	// gatewayd's write requests (gateway_uplink_consumed_capacity_units_total,
	// 0 unless uplink.consumed_capacity is on), ConsumedRCU BatchGetItem's
	// read units; WCUReported says WCU is ConsumedWCU, not computed.
	ConsumedWCU float64 `json:"wcu_reported,omitempty"`
	ConsumedRCU float64 `json:"rcu_reported,omitempty"`
	WCUReported bool    `json:"wcu_is_reported"`
	// DynamoCPU is DynamoDB Local's CPU time from ready to an empty queue.
	DynamoCPU      float64 `json:"dynamodb_local_cpu_s"`
	IdleMemory     memory  `json:"memory_not_forwarding"`
	IdleReady      float64 `json:"ready_not_forwarding_s"`
	ReadingsStored int64   `json:"readings_in_table"`
	// Concurrency is gateway_uplink_concurrency (the lambda target's
	// gateway_uplink_lambda_concurrency), the requests the uplink let
	// itself have in flight, at each scrape of the drain.
	Concurrency []float64 `json:"uplink_concurrency"`
	// RequestSeconds is the time gatewayd's requests to DynamoDB took, all
	// added up (gateway_uplink_request_duration_seconds_sum): over Seconds,
	// the requests it had in flight on average.
	RequestSeconds float64 `json:"request_seconds"`
	// Invocations and InvokedBatches are the lambda target's invocations
	// and the device batches they carried.
	Invocations    float64 `json:"lambda_invocations,omitempty"`
	InvokedBatches float64 `json:"lambda_invoked_batches,omitempty"`
	MarkersStored  int64   `json:"markers_in_table"`
}

// progress is a point of a drain's progress.
type progress struct {
	Seconds  float64 `json:"s"`
	Readings float64 `json:"readings"`
}

// drainProfile is the length of the CPU profile a drain takes from its
// start (--cpu-profile-dir): shorter than a 100,000-reading drain.
const drainProfile = 10 * time.Second

// progressEvery is how often the drain's progress is recorded.
const progressEvery = 5 * time.Second

// bracketedDrain is a backlog forwarded by gatewayd between two runs of
// the plain writer of the same items.
type bracketedDrain struct {
	Backlog backlog      `json:"backlog"`
	DataDir diskUsage    `json:"data_dir"`
	Pricing itemPricing  `json:"item_pricing"`
	Gateway gatewayDrain `json:"gatewayd"`
	// Before and After are the plain writer of the same items (readings
	// and markers) just before and just after gatewayd's drain: the faster
	// is the ceiling. ReadingsOnly is the plain writer of the readings
	// alone, after them: a second line.
	Before       plainRun `json:"plain_before"`
	After        plainRun `json:"plain_after"`
	ReadingsOnly plainRun `json:"plain_readings_only"`
}

// bracket writes a backlog of the drains' size and shape into dir and has
// gatewayd forward it in mode, to endpoint (DynamoDB Local when empty),
// between two runs of the plain same-items writer with g goroutines
// through plain, then runs the readings-only writer. It returns the
// backlog's items too.
func (r *runner) bracket(ctx context.Context, dir, mode, endpoint string, plain *dynamodb.Client, g int) (bracketedDrain, []*itemBatch, error) {
	var b bracketedDrain
	batches := r.cfg.DrainReadings / r.cfg.Readings
	r.log.Info("drain: writing the backlog", "dir", filepath.Base(dir), "batches", batches, "readings", batches*r.cfg.Readings)
	f, err := r.writeBacklog(ctx, dir, r.cfg.maxDevices(), batches)
	if err != nil {
		return b, nil, err
	}
	b.Backlog, b.DataDir, b.Pricing = f.info, f.usage, priceItems(f.items)
	if b.Before, err = r.plainAt(ctx, plain, f.items, true, b.Pricing, g); err != nil {
		return b, nil, err
	}
	if b.Gateway, err = r.gatewayDrain(ctx, r.dynamo.client, dir, mode, endpoint, nil); err != nil {
		return b, nil, err
	}
	if b.After, err = r.plainAt(ctx, plain, f.items, true, b.Pricing, g); err != nil {
		return b, nil, err
	}
	b.ReadingsOnly, err = r.plainAt(ctx, plain, f.items, false, b.Pricing, g)
	return b, f.items, err
}

// ceiling is the faster of the plain runs just before and just after the
// drain.
func (b bracketedDrain) ceiling() plainRun { return bestPlain([]plainRun{b.Before, b.After}) }

// ratio is the drain's rate over its ceiling's.
func (b bracketedDrain) ratio() float64 {
	c := b.ceiling().rate()
	if c <= 0 || b.Gateway.Seconds <= 0 {
		return 0
	}
	return b.Gateway.Readings / b.Gateway.Seconds / c
}

// medianDrain is the index of the drain of runs whose ratio to its
// ceiling is the median (the lower middle one of an even count).
func medianDrain(runs []bracketedDrain) int {
	order := make([]int, len(runs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(runs[a].ratio(), runs[b].ratio()) })
	return order[(len(order)-1)/2]
}

// countsDiffer describes how what gatewayd forwarded and the tables hold
// differ from the backlog, or is "" when they do not.
func (b bracketedDrain) countsDiffer() string {
	gw := b.Gateway
	if int64(gw.Readings) == int64(b.Backlog.Readings) && gw.ReadingsStored == int64(b.Backlog.Readings) &&
		gw.MarkersStored == int64(b.Backlog.Batches) {
		return ""
	}
	return fmt.Sprintf("backlog %d readings in %d batches; gatewayd forwarded %.0f readings, %.0f markers; tables hold %d readings, %d markers",
		b.Backlog.Readings, b.Backlog.Batches, gw.Readings, gw.Markers, gw.ReadingsStored, gw.MarkersStored)
}

// drainRun is the detail of one write mode; its plain writer runs at the
// sweep's best goroutine count.
type drainRun struct {
	bracketedDrain
	// Repeats are every drain of the mode, in the order run, when it
	// drains more than once; the one above is the Median-th (from 1),
	// their median by ratio to its ceiling.
	Repeats []bracketedDrain `json:"repeats,omitempty"`
	Median  int              `json:"median_repeat,omitempty"`
	// Bulk is the uplink's bulk writer run from the bench's process on
	// this backlog (batch mode only).
	Bulk     *bulkRun  `json:"bulk_in_process,omitempty"`
	SDK      sdkResult `json:"sdk_loop"`
	SDKWCU   float64   `json:"sdk_wcu_computed"`
	SDKStore int64     `json:"sdk_readings_in_table"`
}

func (r *runner) drain(ctx context.Context) error {
	client := r.dynamo.client
	probe, err := r.warmDynamo(ctx)
	if err != nil {
		return err
	}
	r.res.Details["consumed capacity probe"] = probe
	if probe.Returned["PutItem"] || probe.Returned["BatchWriteItem"] || probe.Returned["TransactWriteItems"] {
		r.res.note("DynamoDB Local returns ConsumedCapacity with ReturnConsumedCapacity=TOTAL: %v units for "+
			"PutItem (1 marker), BatchWriteItem (%d readings), TransactWriteItems (2 readings), returned %v; "+
			"gatewayd asks for it only with uplink.consumed_capacity; without it its WCUs are computed from DynamoDB's documented rules "+
			"(item size rounded up to 1 KB, transactional writes 2x) and the request counts in its metrics",
			probe.Units, probe.Items["BatchWriteItem"], probe.Returned)
	} else {
		r.res.note("DynamoDB Local returns no ConsumedCapacity (ReturnConsumedCapacity=TOTAL on PutItem, " +
			"BatchWriteItem, TransactWriteItems): WCUs are computed from DynamoDB's documented rules " +
			"(item size rounded up to 1 KB, transactional writes 2x)")
	}
	sweep, err := r.sweepCeiling(ctx)
	if err != nil {
		return err
	}
	r.res.Details["drain ceiling sweep"] = sweep
	first := true
	for _, mode := range writeModes {
		if !slices.Contains(r.cfg.DrainModes, mode) {
			continue
		}
		run, err := r.drainMode(ctx, client, mode, sweep.Best.Goroutines)
		if err != nil {
			return fmt.Errorf("%s mode: %w", mode, err)
		}
		r.res.Details["drain "+mode] = run
		r.reportDrain(mode, run, sweep, first)
		first = false
	}
	if r.cfg.LinkDelay > 0 {
		run, err := r.drainSlowLink(ctx)
		if err != nil {
			return fmt.Errorf("slow link: %w", err)
		}
		r.res.Details["drain batch, slow link"] = run
		r.reportSlowLink(run)
	}
	return nil
}

// sweepCeiling runs the plain writer at each of --ceiling-goroutines on a
// backlog of the drains' size and shape, to find its fastest goroutine
// count.
func (r *runner) sweepCeiling(ctx context.Context) (plainCeiling, error) {
	dir := filepath.Join(r.work, "drain-sweep")
	batches := r.cfg.DrainReadings / r.cfg.Readings
	r.log.Info("drain: the plain writer's goroutine counts", "counts", joinCounts(r.cfg.CeilingGoroutines))
	f, err := r.writeBacklog(ctx, dir, r.cfg.maxDevices(), batches)
	if err != nil {
		return plainCeiling{}, err
	}
	return r.ceiling(ctx, f.items, priceItems(f.items))
}

// reportDrain adds one write mode's drain figures, each against the faster
// of the plain writer's runs just before and just after the drain; the
// first mode's report notes the goroutine sweep too.
func (r *runner) reportDrain(mode string, run drainRun, sweep plainCeiling, first bool) {
	gw := run.Gateway
	section := "drain " + mode
	best := run.ceiling()
	base := fmt.Sprintf("plain same-items BatchWriteItem (readings and a marker a batch), %d goroutines (fastest of %s), faster of the runs just before and after",
		best.Goroutines, strings.ReplaceAll(joinCounts(r.cfg.CeilingGoroutines), ",", "/"))
	// Transactions write every item twice by DynamoDB's pricing: that mode
	// is shown against the ceiling without a target.
	var rateTarget, workTarget *target
	if mode != "transaction" {
		rateTarget, workTarget = ratioAtLeast(0.9), ratioAtMost(1.1)
	}
	plainReadings := float64(best.Readings)
	r.res.add(section, "readings/s until pending is 0", "readings/s", gw.Readings/gw.Seconds, best.rate(), base, rateTarget)
	if ro := run.ReadingsOnly; ro.Readings > 0 {
		r.res.add(section, "readings/s until pending is 0, against the readings alone", "readings/s", gw.Readings/gw.Seconds, ro.rate(),
			fmt.Sprintf("plain BatchWriteItem of the readings alone (no markers), %d goroutines, just after", ro.Goroutines), nil)
	}
	var gwReq float64
	for _, n := range gw.Requests {
		gwReq += n
	}
	r.res.add(section, "requests per 1,000 readings", "req", 1000*gwReq/gw.Readings, 1000*float64(best.Requests)/plainReadings, base, nil)
	wcuName := "write capacity per reading (computed)"
	if gw.WCUReported && best.WCUReported {
		wcuName = "write capacity per reading (reported by DynamoDB)"
	}
	r.res.add(section, wcuName, "WCU", gw.WCU/gw.Readings, best.WCU/plainReadings, base, workTarget)
	r.res.add(section, "DynamoDB Local CPU per 1,000 readings", "CPU s", 1000*gw.DynamoCPU/gw.Readings,
		1000*best.DynamoCPU/plainReadings, base, workTarget)
	r.res.add(section, "gatewayd CPU per 1,000 readings forwarded", "CPU s", 1000*gw.CPUSeconds/gw.Readings,
		1000*best.ClientCPU/plainReadings, base+", its process", nil)
	if b := run.Bulk; b != nil {
		r.res.add(section, "readings/s, explained: the same write plan from the bench's process", "readings/s",
			gw.Readings/gw.Seconds, float64(b.Readings)/b.Seconds,
			fmt.Sprintf("the uplink's bulk writer, %d requests in flight, items built beforehand", b.Concurrency), nil)
	}
	sdk := run.SDK
	if sdk.Readings > 0 {
		r.res.add(section, "readings/s, explained: the same requests from a bare SDK loop", "readings/s",
			gw.Readings/gw.Seconds, float64(sdk.Readings)/sdk.Seconds, "SDK loop, same requests", nil)
	}
	r.res.add("footprint", "RSS while draining, "+mode+" mode (max VmRSS)", "MB", mb(gw.MaxRSS), mb(gw.IdleMemory.RSS),
		"gatewayd, same backlog, not forwarding", atMost(128, "MB"))
	if first {
		var runs []string
		for _, p := range sweep.Runs {
			runs = append(runs, fmt.Sprintf("%d: %.0f", p.Goroutines, p.rate()))
		}
		r.res.note("drain: the plain writer's readings/s by goroutines %s, on a backlog of the same size and shape "+
			"(each on fresh tables); the fastest count writes the ceiling next to each drain", strings.Join(runs, ", "))
	}
	r.res.note("%s: plain same-items writer at %d goroutines %.0f readings/s just before gatewayd's drain and %.0f just after "+
		"(DynamoDB Local CPU %.3f and %.3f s per 1,000 readings); the readings alone %.0f readings/s (%.3f s)", section, best.Goroutines,
		run.Before.rate(), run.After.rate(),
		1000*run.Before.DynamoCPU/float64(run.Before.Readings), 1000*run.After.DynamoCPU/float64(run.After.Readings),
		run.ReadingsOnly.rate(), 1000*run.ReadingsOnly.DynamoCPU/float64(max(run.ReadingsOnly.Readings, 1)))
	if len(run.Repeats) == 0 {
		r.noteBracketSpread(section, run.Before, run.After, gw)
	}
	if b := run.Bulk; b != nil {
		r.res.note("%s: the uplink's bulk writer from the bench's process (marker lookups, markers with the readings, "+
			"items built beforehand), %d requests in flight: %.0f readings/s, DynamoDB Local CPU %.3f s and the bench's %.3f s per 1,000 readings",
			section, b.Concurrency, float64(b.Readings)/b.Seconds, 1000*b.DynamoCPU/float64(b.Readings), 1000*b.ClientCPU/float64(b.Readings))
	}
	if gw.ConsumedWCU > 0 || best.WCUReported {
		r.res.note("%s: DynamoDB reported %.0f WCU for gatewayd's writes and %.0f RCU for its BatchGetItem lookups "+
			"(%.3f RCU per reading), %.0f WCU for the plain writer; computed from the item sizes: gatewayd %.0f WCU",
			section, gw.ConsumedWCU, gw.ConsumedRCU, gw.ConsumedRCU/gw.Readings, best.WCU, gatewayWCU(gw, run.Pricing))
	}
	differ := run.countsDiffer()
	if len(run.Repeats) > 0 {
		var ratios []string
		for k, b := range run.Repeats {
			ratios = append(ratios, fmt.Sprintf("%.0f / %.0f = %.3f", b.Gateway.Readings/b.Gateway.Seconds,
				b.ceiling().rate(), b.ratio()))
			which := fmt.Sprintf("%s, drain %d of %d", section, k+1, len(run.Repeats))
			if d := b.countsDiffer(); d != "" {
				r.res.note("%s: counts differ: %s", which, d)
			}
			r.noteBracketSpread(which, b.Before, b.After, b.Gateway)
		}
		r.res.note("%s: %d drains, each on its own backlog between its own plain-writer runs (readings/s, gatewayd / the faster plain run, in the order run): %s; "+
			"the figures above are drain %d's, the median", section, len(run.Repeats), strings.Join(ratios, ", "), run.Median)
		differ = "" // noted above
	}
	if differ != "" || (sdk.Readings > 0 && run.SDKStore != int64(sdk.Readings)) {
		r.res.note("%s: counts differ: %s; SDK loop table %d readings of %d", section, cmp.Or(differ, "gatewayd's counts agree"),
			run.SDKStore, sdk.Readings)
	}
	perBatch := float64(r.cfg.Readings)
	r.res.note("%s: %d readings from %d devices, %d a batch; gatewayd: requests %v, transaction limit %.0f, "+
		"%.0f request errors, ready after %.2fs, CPU %.1fs, DynamoDB Local CPU %.1fs, requests in flight allowed %s, on average in flight %.1f; "+
		"on AWS (100 actions a transaction) transaction mode would write each batch as one transaction: %.2f WCU per reading",
		section, run.Backlog.Readings, run.Backlog.Devices, r.cfg.Readings, gw.Requests, gw.TxLimit,
		gw.RequestErrors, gw.ReadySeconds, gw.CPUSeconds, gw.DynamoCPU, spread(gw.Concurrency), gw.RequestSeconds/gw.Seconds,
		2*(perBatch*run.Pricing.ReadingWCU+run.Pricing.MarkerWCU)/perBatch)
}

// noteBracketSpread notes when the plain writer's runs just before and
// just after a drain differ by more than bracketSpread, with the drain's
// ratio against the slower one.
func (r *runner) noteBracketSpread(section string, before, after plainRun, gw gatewayDrain) {
	if lo, hi := min(before.rate(), after.rate()), max(before.rate(), after.rate()); lo > 0 && hi/lo > bracketSpread {
		r.res.note("%s: the plain writer's runs before and after the drain differ by %.2fx: DynamoDB Local changed speed "+
			"around the drain, and the ratio against the ceiling is uncertain; against the slower run it is %.2fx",
			section, hi/lo, gw.Readings/gw.Seconds/lo)
	}
}

// spread describes a series of polled values: its least, median and
// largest.
func spread(xs []float64) string {
	if len(xs) == 0 {
		return "(not polled)"
	}
	return fmt.Sprintf("%.0f-%.0f (median %.0f of %d polls)", slices.Min(xs), slices.Max(xs), median(xs), len(xs))
}

// warmDynamo warms DynamoDB Local's JIT with a small SDK loop and probes
// whether it returns consumed capacity.
func (r *runner) warmDynamo(ctx context.Context) (capacityProbe, error) {
	r.log.Info("drain: warming DynamoDB Local")
	f, err := r.writeBacklog(ctx, filepath.Join(r.work, "warm"), 100, 300)
	if err != nil {
		return capacityProbe{}, err
	}
	items := f.items
	_, tables, err := newTables(ctx, r.dynamo.client, false)
	if err != nil {
		return capacityProbe{}, err
	}
	defer func() { _ = dropTables(ctx, r.dynamo.client, tables) }()
	probe, err := probeCapacity(ctx, r.dynamo.client, tables, items[0])
	if err != nil {
		return probe, err
	}
	// The SDK loop's transaction mode writes a batch the way the uplink
	// does under the endpoint's per-transaction limit.
	if r.txLimit, err = cloud.ProbeTransactionLimit(ctx, r.dynamo.client, tables.ProcessedBatches); err != nil {
		return probe, err
	}
	if _, err = sdkLoop(ctx, r.dynamo.client, tables, items[1:], r.cfg.UplinkConcurrency, "batch", r.txLimit); err != nil {
		return probe, err
	}
	// The drain's default plan (BatchGetItem lookups, readings and
	// markers in the same BatchWriteItem requests) is warmed too, so that
	// its measured run does not pay for compiling request shapes the
	// other runs had warmed.
	_, err = r.bulkInProcess(ctx, items, r.cfg.UplinkConcurrency)
	return probe, err
}

// bulkRun is the uplink's bulk writer run from the bench's process.
type bulkRun struct {
	Concurrency int     `json:"concurrency"`
	Readings    int     `json:"readings"`
	Seconds     float64 `json:"seconds"`
	DynamoCPU   float64 `json:"dynamodb_local_cpu_s"`
	ClientCPU   float64 `json:"cpu_s"`
}

// bulkInProcess writes batches, built as the uplink builds them, with the
// uplink's bulk writer (tablewrite.WriteBulk: marker lookups, readings and
// markers 25 to a BatchWriteItem) at concurrency requests in flight into
// fresh tables, and measures the write.
func (r *runner) bulkInProcess(ctx context.Context, batches []*itemBatch, concurrency int) (bulkRun, error) {
	run := bulkRun{Concurrency: concurrency}
	client := r.dynamo.client
	_, tables, err := newTables(ctx, client, false)
	if err != nil {
		return run, err
	}
	defer func() { _ = dropTables(ctx, client, tables) }()
	items := make([]*tablewrite.Items, len(batches))
	for i, b := range batches {
		items[i] = b.built
		run.Readings += b.built.Readings()
	}
	r.log.Info("drain: the bulk writer in the bench's process", "concurrency", concurrency, "batches", len(items))
	dyn, self := &cpuMark{pid: r.dynamo.proc.Pid()}, &cpuMark{pid: os.Getpid()}
	cpu := dyn.hooks(self.hooks())
	cpu.start()
	start := time.Now()
	results := tablewrite.New(client, tables, tablewrite.Options{}).WriteBulk(ctx, items, concurrency)
	run.Seconds = time.Since(start).Seconds()
	cpu.end()
	if err := errors.Join(dyn.err, self.err); err != nil {
		return run, err
	}
	run.DynamoCPU, run.ClientCPU = dyn.seconds(), self.seconds()
	for i, res := range results {
		if res.Outcome != tablewrite.Delivered {
			return run, fmt.Errorf("bulk writer: batch %s: %v (%v)", items[i].BatchID, res.Outcome, res.Err)
		}
	}
	return run, nil
}

// bracketSpread is how far apart the plain writer's runs before and after
// a drain may be before the bench says the ceiling moved under the drain.
const bracketSpread = 1.15

// filled is a backlog written into a data directory and read back.
type filled struct {
	info  backlog
	usage diskUsage    // of the data directory, once written
	items []*itemBatch // its batches' items, as the uplink builds them
}

// writeBacklog fills a backlog of batches from devices into dir and reads
// it back.
func (r *runner) writeBacklog(ctx context.Context, dir string, devices, batches int) (filled, error) {
	var f filled
	var err error
	if f.info, err = fillBacklog(ctx, dir, r.nextFleet(), devices, batches, r.cfg.Readings); err != nil {
		return f, err
	}
	if f.usage, err = dirUsage(dir); err != nil {
		return f, err
	}
	pend, err := readBacklog(dir)
	if err != nil {
		return f, err
	}
	f.items, err = allItems(pend)
	return f, err
}

func allItems(pend []buffer.Pending) ([]*itemBatch, error) {
	now := time.Now()
	items := make([]*itemBatch, 0, len(pend))
	for _, p := range pend {
		ib, err := batchItems(p, now)
		if err != nil {
			return nil, err
		}
		items = append(items, ib)
	}
	return items, nil
}

// drainMode fills a backlog and has gatewayd forward it in mode, between
// two runs of the plain writer with goroutines on the same items: one
// just before, one just after. DynamoDB Local's speed drifts over a bench
// by more than the drains differ, so the ceiling is measured next to the
// drain it is compared with. Batch mode does this r.cfg.DrainRepeats
// times, each on a backlog of its own, and reports the median drain.
// Then, in batch mode, the uplink's bulk writer runs the median drain's
// backlog from the bench's process; in transaction mode, the SDK loop
// makes the uplink's requests.
func (r *runner) drainMode(ctx context.Context, client *dynamodb.Client, mode string, goroutines int) (drainRun, error) {
	var run drainRun
	repeats := 1
	if mode == "batch" {
		repeats = r.cfg.DrainRepeats
	}
	var backlogs [][]*itemBatch
	for k := range repeats {
		dir := "drain-" + mode
		if k > 0 {
			dir += fmt.Sprintf("-%d", k+1)
		}
		b, items, err := r.bracket(ctx, filepath.Join(r.work, dir), mode, "", client, goroutines)
		if err != nil {
			return run, err
		}
		// What gatewayd's write requests consumed by DynamoDB's account,
		// when it asked (uplink.consumed_capacity; BatchGetItem's read
		// units left out); otherwise computed from its request and item
		// counts.
		if b.Gateway.ConsumedWCU > 0 {
			b.Gateway.WCU, b.Gateway.WCUReported = b.Gateway.ConsumedWCU, true
		} else {
			b.Gateway.WCU = gatewayWCU(b.Gateway, b.Pricing)
		}
		run.Repeats, backlogs = append(run.Repeats, b), append(backlogs, items)
	}
	median := medianDrain(run.Repeats)
	run.bracketedDrain, run.Median = run.Repeats[median], median+1
	items := backlogs[median]
	if repeats == 1 {
		run.Repeats, run.Median = nil, 0
	}
	sample := items
	if n := r.cfg.DrainBaselineReadings / r.cfg.Readings; n > 0 && n < len(items) {
		sample = items[:n]
	}
	if mode != "transaction" {
		// The bulk plan's requests, without gatewayd: what the plan costs
		// against what gatewayd's process adds.
		b, err := r.bulkInProcess(ctx, items, goroutines)
		if err != nil {
			return run, err
		}
		run.Bulk = &b
	} else {
		// The SDK loop makes the requests of transaction mode.
		r.log.Info("drain: SDK loop", "mode", mode, "concurrency", r.cfg.UplinkConcurrency, "batches", len(sample),
			"transaction_max_items", r.txLimit)
		_, tables, err := newTables(ctx, client, false)
		if err != nil {
			return run, err
		}
		cpu0, err := procCPU(os.Getpid())
		if err != nil {
			return run, err
		}
		run.SDK, err = sdkLoop(ctx, client, tables, sample, r.cfg.UplinkConcurrency, mode, r.txLimit)
		cpu1, cerr := procCPU(os.Getpid())
		run.SDK.ClientCPU = (cpu1 - cpu0).Seconds()
		err = errors.Join(err, cerr)
		if err == nil {
			run.SDKStore, err = countItems(ctx, client, tables.Readings)
		}
		if err := errors.Join(err, dropTables(ctx, client, tables)); err != nil {
			return run, err
		}
	}
	sdkBatchReadings := float64(run.SDK.Readings - int(run.SDK.TxReadings))
	run.SDKWCU = (sdkBatchReadings+float64(run.SDK.Unprocessed))*run.Pricing.ReadingWCU +
		float64(run.SDK.Requests["PutItem"])*run.Pricing.MarkerWCU +
		2*(float64(run.SDK.TxReadings)*run.Pricing.ReadingWCU+float64(run.SDK.Requests["TransactWriteItems"])*run.Pricing.MarkerWCU)
	return run, nil
}

// gatewayWCU prices what gatewayd wrote, from its metrics: BatchWriteItem
// items (resent unprocessed ones too) and PutItem markers at one standard
// write each, readings and markers of transactions at two.
func gatewayWCU(g gatewayDrain, p itemPricing) float64 {
	txReadings := max(0, g.Readings-g.BatchItems)
	// In batch mode the markers share the BatchWriteItem requests.
	batchMarkers := max(0, g.BatchItems-g.Readings)
	return (g.BatchItems-batchMarkers+g.Unprocessed)*p.ReadingWCU + (batchMarkers+g.Requests["PutItem"])*p.MarkerWCU +
		2*(txReadings*p.ReadingWCU+g.Requests["TransactWriteItems"]*p.MarkerWCU)
}

// drainTarget starts what gatewayd forwards to besides DynamoDB Local, for
// the tables of prefix, and returns gatewayd's extra settings and how to
// stop it.
type drainTarget func(ctx context.Context, prefix string) (env []string, stop func(), err error)

// gatewayDrain has gatewayd forward the backlog in dir in write mode mode,
// to DynamoDB Local (at endpoint, when it is not empty), or through target
// when it is not nil.
func (r *runner) gatewayDrain(ctx context.Context, client *dynamodb.Client, dir, mode, endpoint string, target drainTarget) (gatewayDrain, error) {
	gd := gatewayDrain{Mode: mode, Requests: map[string]float64{}}
	// gatewayd starts at the SDK loop's concurrency and adapts it as it
	// would anywhere (up to its default uplink.max_concurrency), as the
	// plain writer's best goroutine count is chosen for the ceiling.
	env := r.env("GATEWAY_UPLINK_WRITE_MODE="+mode,
		fmt.Sprintf("GATEWAY_UPLINK_CONCURRENCY=%d", r.cfg.UplinkConcurrency))
	logPath := filepath.Join(r.work, "gatewayd-"+filepath.Base(dir)+".log")

	// The same backlog, not forwarding: the memory baseline.
	r.log.Info("drain: gatewayd, not forwarding", "mode", mode)
	g, err := startGatewayd(ctx, gatewaydSpec{bin: r.bin, dataDir: dir, endpoint: r.closed, prefix: "nowhere_",
		logPath: logPath, env: env})
	if err != nil {
		return gd, err
	}
	gd.IdleReady = g.ready.Seconds()
	sleepCtx(ctx, 2*time.Second)
	gd.IdleMemory, err = procMemory(g.pid())
	if err := errors.Join(err, g.stop()); err != nil {
		return gd, err
	}

	prefix, tables, err := newTables(ctx, client, false)
	if err != nil {
		return gd, err
	}
	defer func() { _ = dropTables(ctx, client, tables) }()
	if target != nil {
		extra, stop, err := target(ctx, prefix)
		if err != nil {
			return gd, err
		}
		defer stop()
		env = append(env, extra...)
	}
	r.log.Info("drain: gatewayd forwarding", "mode", mode, "through_lambda", target != nil)
	g, err = startGatewayd(ctx, gatewaydSpec{bin: r.bin, dataDir: dir, endpoint: cmp.Or(endpoint, r.dynamo.endpoint), prefix: prefix,
		logPath: logPath, env: env})
	if err != nil {
		return gd, err
	}
	defer g.proc.Kill()
	// Counters start at zero with the process, so its totals are what it
	// forwarded; the time runs from ready (forwarding starts with the
	// process, a few milliseconds earlier at most) to an empty queue.
	gd.ReadySeconds = g.ready.Seconds()
	t0 := time.Now()
	cpu0, err := procCPU(g.pid())
	if err != nil {
		return gd, err
	}
	dyn0, err := procCPU(r.dynamo.proc.Pid())
	if err != nil {
		return gd, err
	}
	deadline := t0.Add(r.cfg.DrainTimeout)
	var cpuProf *pprofCPU
	if r.cfg.CPUProfileDir != "" {
		// Named after the backlog's directory: drain-MODE, drain-MODE-N
		// for the repeats, drain-slow-link, drain-lambda-N.
		cpuProf = &pprofCPU{g: g, seconds: drainProfile, path: filepath.Join(r.cfg.CPUProfileDir, "cpu-"+filepath.Base(dir)+".pb.gz")}
		cpuProf.start()
	}
	limitMetric := "gateway_uplink_concurrency"
	if target != nil {
		limitMetric = "gateway_uplink_lambda_concurrency"
	}
	nextProgress, nextScrape := t0, t0.Add(drainScrape)
	var m samples
	for {
		sleepCtx(ctx, drainPoll)
		if err := ctx.Err(); err != nil {
			return gd, err
		}
		mem, err := procMemory(g.pid())
		if err != nil {
			return gd, err
		}
		gd.MaxRSS = max(gd.MaxRSS, mem.RSS)
		if time.Now().Before(nextScrape) {
			continue
		}
		nextScrape = nextScrape.Add(drainScrape)
		if m, err = g.metrics(ctx); err != nil {
			return gd, err
		}
		gd.Concurrency = append(gd.Concurrency, m.sum(limitMetric))
		if now := time.Now(); !now.Before(nextProgress) {
			gd.Progress = append(gd.Progress, progress{Seconds: now.Sub(t0).Seconds(), Readings: m.sum("gateway_uplink_readings_total")})
			nextProgress = nextProgress.Add(progressEvery)
		}
		if m.sum("gateway_buffer_pending_batches") == 0 {
			break
		}
		if time.Now().After(deadline) {
			return gd, fmt.Errorf("%.0f batches still pending after %s", m.sum("gateway_buffer_pending_batches"), r.cfg.DrainTimeout)
		}
	}
	gd.Seconds = time.Since(t0).Seconds()
	// The drain ends at gatewayd's last delivery, up to a scrape before
	// the bench saw nothing pending; gatewayd stamps it by its corrected
	// clock, the system clock plus gateway_clock_offset_seconds.
	last := m.sum("gateway_uplink_last_delivery_timestamp_seconds") - m.sum("gateway_clock_offset_seconds")
	if last := time.Unix(0, int64(last*1e9)); last.After(t0) {
		gd.Seconds = min(gd.Seconds, last.Sub(t0).Seconds())
	}
	dyn1, err := procCPU(r.dynamo.proc.Pid())
	if err != nil {
		return gd, err
	}
	gd.DynamoCPU = (dyn1 - dyn0).Seconds()
	// One scrape's samples are not read at one instant: read the totals
	// again once the queue is empty.
	sleepCtx(ctx, 500*time.Millisecond)
	if m, err = g.metrics(ctx); err != nil {
		return gd, err
	}
	cpu1, err := procCPU(g.pid())
	if err != nil {
		return gd, err
	}
	gd.CPUSeconds = (cpu1 - cpu0).Seconds()
	mem, err := procMemory(g.pid())
	if err != nil {
		return gd, err
	}
	gd.HWM = mem.HWM
	gd.Readings = m.sum("gateway_uplink_readings_total")
	gd.Progress = append(gd.Progress, progress{Seconds: gd.Seconds, Readings: gd.Readings})
	gd.Markers = m.sum("gateway_uplink_batches_total", `result="delivered"`) +
		m.sum("gateway_uplink_batches_total", `result="already_delivered"`)
	for _, op := range []string{"TransactWriteItems", "BatchWriteItem", "BatchGetItem", "PutItem", "UpdateItem", "DescribeTable"} {
		if n := m.sum("gateway_uplink_request_duration_seconds_count", `operation="`+op+`"`); n > 0 {
			gd.Requests[op] = n
		}
	}
	for _, op := range []string{"TransactWriteItems", "BatchWriteItem", "PutItem", "UpdateItem"} {
		gd.ConsumedWCU += m.sum("gateway_uplink_consumed_capacity_units_total", `operation="`+op+`"`)
	}
	gd.RequestSeconds = m.sum("gateway_uplink_request_duration_seconds_sum")
	gd.ConsumedRCU = m.sum("gateway_uplink_consumed_capacity_units_total", `operation="BatchGetItem"`)
	gd.BatchItems = m.sum("gateway_uplink_batch_write_items_sum")
	gd.Unprocessed = m.sum("gateway_uplink_unprocessed_items_total")
	gd.RequestErrors = m.sum("gateway_uplink_request_errors_total")
	gd.ErrorsByKind = map[string]float64{}
	for series, v := range m {
		if strings.HasPrefix(series, "gateway_uplink_request_errors_total{") && v > 0 {
			gd.ErrorsByKind[series] = v
		}
	}
	gd.TxLimit = m.sum("gateway_uplink_transaction_max_items")
	gd.Invocations = m.sum("gateway_uplink_lambda_invocation_batches_count")
	gd.InvokedBatches = m.sum("gateway_uplink_lambda_invocation_batches_sum")
	// A drain shorter than the profile ends before it does.
	if cpuProf != nil {
		if cpuProf.end(); cpuProf.err != nil {
			return gd, cpuProf.err
		}
	}
	if err := g.stop(); err != nil {
		return gd, err
	}
	if gd.ReadingsStored, err = countItems(ctx, client, tables.Readings); err != nil {
		return gd, err
	}
	if gd.MarkersStored, err = countItems(ctx, client, tables.ProcessedBatches); err != nil {
		return gd, err
	}
	return gd, nil
}
