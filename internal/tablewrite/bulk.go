package tablewrite

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"greenhouse-gateway/internal/cloud"
)

// WriteBulk writes many batches of one writer, at the cost of plain
// writes: no transaction and no conditional write per batch.
//
//  1. Every batch's marker is looked up first, 100 to a consistent
//     BatchGetItem. A marker found decides the batch (Duplicate, or
//     Conflict for another payload) and nothing of it is written.
//  2. The readings of the others are packed 25 to a BatchWriteItem, up to
//     concurrency requests in flight. A batch's marker joins the next
//     requests once every request carrying its readings is answered, so
//     that a marker is never in the table without its readings. Readings
//     have deterministic keys: a replay overwrites identical items.
//  3. The markers of one device's batches go in the order given: a marker
//     is sent only after the one before it was written, or in the same
//     request. A batch whose write fails holds the device's later batches
//     back (Failed, ErrHeldBack), so they are not recorded as delivered
//     before it. A batch whose marker the lookup finds is decided
//     (Duplicate) only once the device's batches before it are, and held
//     back with them: DynamoDB may apply the later of two markers in one
//     request and leave the earlier unprocessed.
//
// The marker write is unconditional: the lookup decided it. WriteBulk is
// exact when the caller is the only writer of these batch_ids while it
// runs, as the gateway is of the batches in its buffer: a batch written
// meanwhile by someone else (the same batch sent by the device to the
// readings function at the same moment) would get its marker written
// twice, with the same content when the payload is the same; another
// payload's readings would be written over it and both answered
// Delivered. Write, whose marker is conditional (in the readings'
// transaction when they fit), answers Conflict to one of two such writers.
//
// A request DynamoDB refuses, for its content or its shape, has its items
// sent again one batch to a request, to find which batch is refused
// (Rejected, or Failed for a shape the batch alone still has). The
// readings of a refused batch that other requests wrote are deleted
// before WriteBulk returns (unwrite).
// It returns each batch's result, in the order given.
func (w *Writer) WriteBulk(ctx context.Context, batches []*Items, concurrency int) []Result {
	b := w.StartBulk(ctx, concurrency)
	b.Add(batches...)
	return b.Wait()
}

// WriteLookedUp is WriteBulk for batches whose markers the caller has
// just looked up (MarkerHashes) and not found: it writes them without
// looking up again. As with WriteBulk, a batch written by another writer
// between the caller's lookup and this write gets its marker written
// twice, with the same content when the payload is the same (the same
// race as WriteBulk's).
func (w *Writer) WriteLookedUp(ctx context.Context, batches []*Items, concurrency int) []Result {
	b := w.StartLookedUp(ctx, concurrency)
	b.Add(batches...)
	return b.Wait()
}

// StartLookedUp starts a WriteLookedUp with no batch yet: a Bulk whose
// Add looks nothing up.
func (w *Writer) StartLookedUp(ctx context.Context, concurrency int) *Bulk {
	b := w.StartBulk(ctx, concurrency)
	b.b.lookedUp = true
	return b
}

// Bulk is a WriteBulk whose batches are added while it runs: each Add's
// markers are looked up, and its readings written, while the caller
// builds the next ones. A device's batches must be added in order, across
// calls too.
type Bulk struct{ b *bulk }

// StartBulk starts a WriteBulk with no batch yet.
func (w *Writer) StartBulk(ctx context.Context, concurrency int) *Bulk {
	b := &bulk{w: w, ctx: ctx, concurrency: max(concurrency, 1), last: map[string]int{}, stopped: map[string]int{},
		found: map[int]Result{}, done: make(chan struct{})}
	b.cond = sync.NewCond(&b.mu)
	b.lookupSem = make(chan struct{}, b.concurrency)
	go b.run()
	return &Bulk{b: b}
}

// Add adds batches after those added before.
func (bk *Bulk) Add(batches ...*Items) {
	b := bk.b
	// The reading items are made here, outside the lock.
	for _, it := range batches {
		if b.w.encodes {
			it.encode()
		} else {
			it.readingMaps()
		}
	}
	b.mu.Lock()
	first := len(b.batches)
	for _, it := range batches {
		i := len(b.batches)
		// The bulk's own copy: it lets go of the items once the batch
		// is decided (decide), without changing the caller's.
		cp := *it
		b.batches = append(b.batches, &cp)
		b.results = append(b.results, Result{})
		b.decided = append(b.decided, false)
		b.checked = append(b.checked, false)
		b.unwritten = append(b.unwritten, 0)
		b.marker = append(b.marker, markerWaiting)
		b.prev, b.next = append(b.prev, -1), append(b.next, -1)
		if p, ok := b.last[it.HardwareID]; ok {
			b.prev[i], b.next[p] = p, i
		}
		b.last[it.HardwareID] = i
		b.left++
		if stop, ok := b.stopped[it.HardwareID]; ok {
			// Added after a batch of its device failed: held back too.
			b.decide(i, b.heldBack(i, stop))
		}
	}
	if b.lookedUp {
		for idx := first; idx < first+len(batches); idx++ {
			if !b.decided[idx] {
				b.checked[idx] = true
				b.queueReadings(idx)
			}
		}
		for idx := first; idx < first+len(batches); idx++ {
			b.promote(idx)
		}
		b.cond.Broadcast()
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	for start := first; start < first+len(batches); start += BatchGetMax {
		b.lookup(start, min(start+BatchGetMax, first+len(batches)))
	}
}

// WaitBelow waits until fewer than n (at least 1) of the batches added
// are undecided, or ctx is done. A caller that builds batches faster
// than they are written holds only about n batches' items at a time by
// calling it before it builds more.
func (bk *Bulk) WaitBelow(ctx context.Context, n int) error {
	b := bk.b
	stop := context.AfterFunc(ctx, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.cond.Broadcast()
	})
	defer stop()
	n = max(n, 1)
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.left >= n && ctx.Err() == nil {
		b.cond.Wait()
	}
	return ctx.Err()
}

// Wait waits for every batch added and returns their results, in the
// order added. No batch may be added after it.
func (bk *Bulk) Wait() []Result {
	b := bk.b
	b.lookups.Wait()
	b.mu.Lock()
	b.closed = true
	b.cond.Broadcast()
	b.mu.Unlock()
	<-b.done
	// Nothing is in flight now: the readings of refused batches written
	// by other requests can be deleted.
	for i, r := range b.results {
		if r.Outcome == Rejected {
			b.results[i] = b.w.unwrite(b.ctx, b.batches[i], r)
			b.batches[i].drop()
		}
	}
	return b.results
}

// bulkPart is one batch's items in a bulk request: its readings, or its
// marker.
type bulkPart struct {
	owner  int
	marker bool
	reqs   []types.WriteRequest
}

type bulkRequest struct {
	parts []bulkPart
	items int
	solo  bool // one batch's items only: a refusal is that batch's
}

// markerState is where a batch's marker is.
type markerState int

const (
	markerWaiting markerState = iota // readings unwritten, or the device's previous marker not yet written
	markerQueued                     // may go in the next request
	markerSent                       // in a request; once written, the batch is decided Delivered
)

type bulk struct {
	w           *Writer
	ctx         context.Context
	concurrency int
	// lookedUp: the caller looked the markers up (WriteLookedUp).
	lookedUp  bool
	lookupSem chan struct{}
	lookups   sync.WaitGroup
	done      chan struct{} // closed when run returns

	mu   sync.Mutex
	cond *sync.Cond
	// batches and the slices beside them grow with Add.
	batches []*Items
	results []Result
	decided []bool
	checked []bool // the marker lookup answered
	// found holds the result of a batch whose marker the lookup found,
	// until the device's batches before it are decided.
	found map[int]Result
	// prev and next link each device's batches, in the order added; last
	// is each device's last batch; stopped is each device's first failed
	// batch, which holds back the device's batches added later too.
	prev, next []int
	last       map[string]int
	stopped    map[string]int
	// readings holds the parts of readings not sent yet, in order; solo
	// the parts of refused requests to send again alone.
	readings []bulkPart
	solo     []bulkPart
	// soloInflight is set while a solo request is in flight.
	soloInflight bool
	// unwritten counts each batch's readings not yet acknowledged.
	unwritten []int
	marker    []markerState
	queue     []int // batches whose markers are markerQueued, in order
	inflight  int
	left      int  // batches not decided
	closed    bool // Wait was called: no more batches
}

// lookup looks up the markers of batches [from, to) in one BatchGetItem:
// a marker found decides its batch; the others' readings join the queue.
func (b *bulk) lookup(from, to int) {
	b.mu.Lock()
	part := slices.Clone(b.batches[from:to])
	b.mu.Unlock()
	b.lookupSem <- struct{}{}
	b.lookups.Go(func() {
		defer func() { <-b.lookupSem }()
		ids := make([]string, len(part))
		for i, it := range part {
			ids[i] = it.BatchID
		}
		found, err := b.w.MarkerHashes(b.ctx, ids)
		b.mu.Lock()
		defer b.mu.Unlock()
		defer b.cond.Broadcast()
		for i, it := range part {
			idx := from + i
			if b.decided[idx] {
				continue
			}
			switch h, ok := found[it.BatchID]; {
			case err != nil:
				b.fail(idx, b.w.notRefused("BatchGetItem", it.BatchID, err))
			case ok:
				b.found[idx] = compareHash(it, h) // decided by promote
			default:
				b.checked[idx] = true
				b.queueReadings(idx)
			}
		}
		for idx := from; idx < to; idx++ {
			b.promote(idx)
		}
	})
}

// queueReadings puts batch i's readings in line, 25 to a part: given
// encoded when the writer's client takes them so, as maps otherwise.
func (b *bulk) queueReadings(i int) {
	it := b.batches[i]
	var items []map[string]types.AttributeValue
	if b.w.encodes {
		for _, raw := range it.Encode() {
			items = append(items, cloud.EncodedItem(raw))
		}
	} else {
		items = it.readingMaps()
	}
	for start := 0; start < len(items); start += BatchWriteMax {
		part := bulkPart{owner: i}
		for _, r := range items[start:min(start+BatchWriteMax, len(items))] {
			part.reqs = append(part.reqs, types.WriteRequest{PutRequest: &types.PutRequest{Item: r}})
		}
		b.readings = append(b.readings, part)
		b.unwritten[i] += len(part.reqs)
	}
}

// compareHash is the result for a batch whose marker is stored with hash
// stored ("" for a marker without one).
func compareHash(it *Items, stored string) Result {
	if it.hash != "" && stored != "" && stored != it.hash {
		return Result{Outcome: Conflict, Err: fmt.Errorf("batch_id %s: already in the cloud with another payload (payload_hash %s, this one %s)", it.BatchID, stored, it.hash)}
	}
	return Result{Outcome: Duplicate}
}

// run sends requests until Wait was called and every batch is decided.
// The requests go to concurrency long-lived senders rather than a
// goroutine each: a sender's stack grows once to the depth of the SDK's
// request path, instead of once per request.
func (b *bulk) run() {
	defer close(b.done)
	var wg sync.WaitGroup
	// At most concurrency requests are taken and unanswered, so a send to
	// reqs never blocks.
	reqs := make(chan *bulkRequest, b.concurrency)
	defer wg.Wait()
	defer close(reqs)
	b.mu.Lock()
	defer b.mu.Unlock()
	senders := 0
	for {
		for !(b.closed && b.left == 0) && !b.canSend() {
			b.cond.Wait()
		}
		if b.closed && b.left == 0 {
			return
		}
		req := b.take()
		b.inflight++
		if senders < b.inflight {
			senders++
			wg.Go(func() {
				for req := range reqs {
					b.send(b.ctx, req)
				}
			})
		}
		reqs <- req
	}
}

// canSend reports whether a request should go now: a full one, or the
// last markers when nothing in flight can add to them.
func (b *bulk) canSend() bool {
	if b.inflight >= b.concurrency {
		return false
	}
	if (len(b.solo) > 0 && !b.soloInflight) || len(b.readings) > 0 {
		return true
	}
	n := len(b.sendable(BatchWriteMax))
	return n == BatchWriteMax || (n > 0 && b.inflight == 0)
}

// take forms the next request: a refused request's batch alone, or queued
// markers first and then readings, up to BatchWriteMax items.
func (b *bulk) take() *bulkRequest {
	if len(b.solo) > 0 && !b.soloInflight {
		// One at a time, in order: a refused request may have held
		// consecutive markers of one device.
		p := b.solo[0]
		b.solo[0] = bulkPart{}
		b.solo = b.solo[1:]
		b.sent(p)
		b.soloInflight = true
		return &bulkRequest{parts: []bulkPart{p}, items: len(p.reqs), solo: true}
	}
	req := &bulkRequest{}
	take := b.sendable(BatchWriteMax)
	for _, i := range take {
		p := bulkPart{owner: i, marker: true, reqs: []types.WriteRequest{{PutRequest: &types.PutRequest{Item: b.batches[i].marker}}}}
		req.parts = append(req.parts, p)
		req.items++
		b.sent(p)
	}
	if len(take) > 0 {
		b.queue = slices.DeleteFunc(b.queue, func(i int) bool { return b.marker[i] == markerSent })
	}
	for req.items < BatchWriteMax && len(b.readings) > 0 {
		p := b.readings[0]
		if room := BatchWriteMax - req.items; len(p.reqs) > room {
			// Split the part: the rest stays first in line.
			b.readings[0].reqs = p.reqs[room:]
			p.reqs = p.reqs[:room]
		} else {
			// Cleared, so that the slice's array does not keep a
			// written part's items.
			b.readings[0] = bulkPart{}
			b.readings = b.readings[1:]
		}
		req.parts = append(req.parts, p)
		req.items += len(p.reqs)
	}
	return req
}

func (b *bulk) sent(p bulkPart) {
	if p.marker {
		b.marker[p.owner] = markerSent
	}
}

// send writes one request and records what it decided.
func (b *bulk) send(ctx context.Context, req *bulkRequest) {
	var readings, markers []types.WriteRequest
	for _, p := range req.parts {
		if p.marker {
			markers = append(markers, p.reqs...)
		} else {
			readings = append(readings, p.reqs...)
		}
	}
	err := b.w.batchWriteTables(ctx, readings, markers)
	b.mu.Lock()
	defer b.mu.Unlock()
	defer b.cond.Broadcast()
	b.inflight--
	if req.solo {
		b.soloInflight = false
	}
	var res Result
	if err != nil {
		res = b.w.classify("BatchWriteItem", b.batches[req.parts[0].owner].BatchID, err)
	}
	for _, p := range req.parts {
		switch {
		case b.decided[p.owner]:
		case err == nil && p.marker:
			b.decide(p.owner, Result{Outcome: Delivered})
			if n := b.next[p.owner]; n >= 0 {
				b.promote(n)
			}
		case err == nil:
			b.unwritten[p.owner] -= len(p.reqs)
			b.promote(p.owner)
		case res.isolates() && !req.solo:
			// Sent again alone (a marker stays markerSent meanwhile, so
			// that the device's next marker waits for it).
			b.solo = append(b.solo, p)
		default:
			b.fail(p.owner, res)
		}
	}
}

// promote queues batch i's marker when its readings are written and the
// device's previous marker is written or queued before it; a queued marker
// lets the device's next one follow.
func (b *bulk) promote(i int) {
	for ; i >= 0; i = b.next[i] {
		if b.decided[i] {
			continue
		}
		if r, ok := b.found[i]; ok {
			// Its marker is in the table: decided once the device's
			// batches before it are.
			if b.before(i) >= 0 {
				return
			}
			b.decide(i, r)
			continue
		}
		if !b.checked[i] || b.marker[i] != markerWaiting || b.unwritten[i] > 0 {
			return
		}
		if p := b.before(i); p >= 0 && b.marker[p] == markerWaiting {
			return
		}
		b.marker[i] = markerQueued
		b.queue = append(b.queue, i)
	}
}

// fail decides batch i with r, and the device's later batches as held
// back; their readings not sent yet are dropped.
func (b *bulk) fail(i int, r Result) {
	b.decide(i, r)
	if _, ok := b.stopped[b.batches[i].HardwareID]; !ok {
		b.stopped[b.batches[i].HardwareID] = i
	}
	for n := b.next[i]; n >= 0; n = b.next[n] {
		if !b.decided[n] {
			b.decide(n, b.heldBack(n, i))
		}
	}
	b.readings = dropDecided(b.readings, b.decided)
	b.solo = dropDecided(b.solo, b.decided)
	queue := b.queue
	b.queue = nil
	for _, q := range queue {
		if !b.decided[q] {
			b.queue = append(b.queue, q)
		}
	}
}

// ErrHeldBack is the error of a batch not written because an earlier batch
// of its device failed or was refused (WriteBulk, WriteLookedUp, the
// readings function): it is tried again after that one.
var ErrHeldBack = errors.New("held back")

// heldBack is the result of batch n, held back by the failure of batch i
// of the same device.
func (b *bulk) heldBack(n, i int) Result {
	return Result{Outcome: Failed, Err: fmt.Errorf("%w: batch_id %s waits for batch_id %s of the same device (%w)",
		ErrHeldBack, b.batches[n].BatchID, b.batches[i].BatchID, b.results[i].Err)}
}

// decide records batch i's result and lets go of its items: nothing of a
// decided batch is sent again. A refused batch's readings are kept for
// Wait to delete.
func (b *bulk) decide(i int, r Result) {
	if b.decided[i] {
		return
	}
	b.decided[i], b.results[i] = true, r
	delete(b.found, i)
	b.left--
	b.batches[i].marker = nil
	if r.Outcome != Rejected {
		b.batches[i].drop()
	}
}

// before is the device's nearest batch before i still undecided, or -1:
// i's marker goes after that one's.
func (b *bulk) before(i int) int {
	p := b.prev[i]
	for p >= 0 && b.decided[p] {
		p = b.prev[p]
	}
	return p
}

// sendable returns up to limit queued markers that may go in one request,
// in queue order: a marker goes with or after the device's previous one,
// never in a request sent before it.
func (b *bulk) sendable(limit int) []int {
	var out []int
	picked := map[int]bool{}
	for _, i := range b.queue {
		if len(out) == limit {
			break
		}
		if p := b.before(i); p < 0 || picked[p] {
			out = append(out, i)
			picked[i] = true
		}
	}
	return out
}

func dropDecided(parts []bulkPart, decided []bool) []bulkPart {
	out := parts[:0]
	for _, p := range parts {
		if !decided[p.owner] {
			out = append(out, p)
		}
	}
	return out
}

// batchWriteTables writes up to 25 items, readings and markers, resending
// unprocessed ones a few times before giving up with ErrUnprocessed.
func (w *Writer) batchWriteTables(ctx context.Context, readings, markers []types.WriteRequest) error {
	return w.resend(ctx, readings, markers, func(ctx context.Context, readings, markers []types.WriteRequest) (*dynamodb.BatchWriteItemOutput, error) {
		return w.db.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{
			RequestItems:           nonEmpty(map[string][]types.WriteRequest{w.tables.Readings: readings, w.tables.ProcessedBatches: markers}),
			ReturnConsumedCapacity: w.capacity(),
		})
	})
}

// batchWriteFunc sends one BatchWriteItem of readings and markers.
type batchWriteFunc func(ctx context.Context, readings, markers []types.WriteRequest) (*dynamodb.BatchWriteItemOutput, error)

// resend sends readings and markers with send, and what DynamoDB leaves
// unprocessed again up to four times, with a growing jittered wait.
func (w *Writer) resend(ctx context.Context, readings, markers []types.WriteRequest, send batchWriteFunc) error {
	wait := 50 * time.Millisecond
	items := len(readings) + len(markers)
	for attempt := 0; ; attempt++ {
		var out *dynamodb.BatchWriteItemOutput
		err := w.call(ctx, "BatchWriteItem", items, func(ctx context.Context, r *Request) error {
			var err error
			out, err = send(ctx, readings, markers)
			if err == nil {
				r.Consumed = units(out.ConsumedCapacity...)
				// Unprocessed items are DynamoDB throttling part of a request.
				r.Partly = len(out.UnprocessedItems) > 0
				r.Unprocessed = len(out.UnprocessedItems[w.tables.Readings]) + len(out.UnprocessedItems[w.tables.ProcessedBatches])
			}
			return err
		})
		items = 0
		if err != nil {
			return err
		}
		readings, markers = out.UnprocessedItems[w.tables.Readings], out.UnprocessedItems[w.tables.ProcessedBatches]
		left := len(readings) + len(markers)
		if left == 0 {
			return nil
		}
		if attempt == 4 {
			return fmt.Errorf("%d items still unprocessed: %w", left, ErrUnprocessed)
		}
		if err := Sleep(ctx, Jitter(wait)); err != nil {
			return err
		}
		wait *= 2
	}
}

// nonEmpty drops the tables without items from a request: a table's list
// may not be empty.
func nonEmpty(items map[string][]types.WriteRequest) map[string][]types.WriteRequest {
	for table, reqs := range items {
		if len(reqs) == 0 {
			delete(items, table)
		}
	}
	return items
}

// capacity is what requests ask of ReturnConsumedCapacity: TOTAL with
// Options.ConsumedCapacity.
func (w *Writer) capacity() types.ReturnConsumedCapacity {
	if !w.opts.ConsumedCapacity {
		return types.ReturnConsumedCapacityNone
	}
	return types.ReturnConsumedCapacityTotal
}

// units sums the capacity units DynamoDB says a request used.
func units(cc ...types.ConsumedCapacity) float64 {
	var u float64
	for _, c := range cc {
		u += aws.ToFloat64(c.CapacityUnits)
	}
	return u
}
