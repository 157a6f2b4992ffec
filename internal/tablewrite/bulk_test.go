package tablewrite_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/stretchr/testify/require"

	contract "greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/tablewrite"
)

// bulkDB is an in-memory pair of tables that logs every item it applies,
// in order, and can refuse, fail or leave unprocessed the requests that
// hold chosen items.
type bulkDB struct {
	tablewrite.DB
	tables cloud.Tables

	mu sync.Mutex
	// applied holds "r <batch_id> <ts_batch>", "m <batch_id>" and, for a
	// deleted reading, "d <batch_id> <ts_batch>", in apply order.
	applied  []string
	markers  map[string]string
	rows     map[string]bool // the readings in the table, as in applied
	requests [][]string      // each BatchWriteItem's items, as in applied
	// reject refuses, fail fails (network), and unprocessed leaves
	// unprocessed once, any request writing an item of that batch_id
	// (reject: or the reading of that ts_batch).
	reject, fail, unprocessed string
	// neverProcessed is the name of an item (as in applied) left
	// unprocessed by every request that holds it.
	neverProcessed string
	gets           int
	refuseGets     bool // every BatchGetItem is refused
}

func newBulkDB() *bulkDB {
	return &bulkDB{tables: cloud.TableNames(""), markers: map[string]string{}, rows: map[string]bool{}}
}

func itemName(table string, item map[string]types.AttributeValue, tables cloud.Tables) string {
	id := item["batch_id"].(*types.AttributeValueMemberS).Value
	if table == tables.ProcessedBatches {
		return "m " + id
	}
	return "r " + id + " " + item["ts_batch"].(*types.AttributeValueMemberS).Value
}

// requestName is itemName for a put, "d <batch_id> <ts_batch>" for a
// reading's delete.
func requestName(table string, r types.WriteRequest, tables cloud.Tables) string {
	if r.DeleteRequest != nil {
		ts := r.DeleteRequest.Key["ts_batch"].(*types.AttributeValueMemberS).Value
		_, id, _ := strings.Cut(ts, "#")
		return "d " + id + " " + ts
	}
	return itemName(table, r.PutRequest.Item, tables)
}

// stored reports whether the table holds a reading of batchID.
func (f *bulkDB) stored(batchID string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for row := range f.rows {
		if strings.HasPrefix(row, batchID+" ") {
			return true
		}
	}
	return false
}

func (f *bulkDB) BatchWriteItem(_ context.Context, in *dynamodb.BatchWriteItemInput, _ ...func(*dynamodb.Options)) (*dynamodb.BatchWriteItemOutput, error) {
	time.Sleep(100 * time.Microsecond) // let requests overlap
	f.mu.Lock()
	defer f.mu.Unlock()
	var names []string
	holds := func(id string) bool {
		return id != "" && slices.ContainsFunc(names, func(n string) bool { return !strings.HasPrefix(n, "d ") && strings.Contains(n, " "+id) })
	}
	n := 0
	for table, reqs := range in.RequestItems {
		for _, r := range reqs {
			names = append(names, requestName(table, r, f.tables))
			n++
		}
	}
	if n > tablewrite.BatchWriteMax {
		return nil, &smithy.GenericAPIError{Code: "ValidationException", Message: "Too many items requested for the BatchWriteItem call"}
	}
	f.requests = append(f.requests, names)
	switch {
	case holds(f.reject):
		return nil, &smithy.GenericAPIError{Code: "ValidationException", Message: "Item size has exceeded the maximum allowed size"}
	case holds(f.fail):
		return nil, errors.New("connection reset by peer")
	}
	out := &dynamodb.BatchWriteItemOutput{UnprocessedItems: map[string][]types.WriteRequest{}}
	for table, reqs := range in.RequestItems {
		for _, r := range reqs {
			name := requestName(table, r, f.tables)
			if (f.unprocessed != "" && strings.Contains(name, " "+f.unprocessed)) || name == f.neverProcessed {
				out.UnprocessedItems[table] = append(out.UnprocessedItems[table], r)
				continue
			}
			f.applied = append(f.applied, name)
			switch kind, row, _ := strings.Cut(name, " "); {
			case kind == "d":
				delete(f.rows, row)
			case kind == "r":
				f.rows[row] = true
			}
			if table == f.tables.ProcessedBatches {
				hash := ""
				if h, ok := r.PutRequest.Item[tablewrite.AttrPayloadHash].(*types.AttributeValueMemberS); ok {
					hash = h.Value
				}
				f.markers[strings.TrimPrefix(name, "m ")] = hash
			}
		}
	}
	if f.unprocessed != "" && len(out.UnprocessedItems) > 0 {
		f.unprocessed = "" // once
	}
	return out, nil
}

func (f *bulkDB) BatchGetItem(_ context.Context, in *dynamodb.BatchGetItemInput, _ ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gets++
	if f.refuseGets {
		return nil, &smithy.GenericAPIError{Code: "ValidationException", Message: "Provided list of item keys contains duplicates"}
	}
	out := &dynamodb.BatchGetItemOutput{Responses: map[string][]map[string]types.AttributeValue{}}
	for table, ka := range in.RequestItems {
		if len(ka.Keys) > tablewrite.BatchGetMax || !aws.ToBool(ka.ConsistentRead) {
			return nil, errors.New("at most 100 keys, read consistently")
		}
		for _, k := range ka.Keys {
			id := k["batch_id"].(*types.AttributeValueMemberS).Value
			if h, ok := f.markers[id]; ok {
				out.Responses[table] = append(out.Responses[table], map[string]types.AttributeValue{
					"batch_id": k["batch_id"], tablewrite.AttrPayloadHash: &types.AttributeValueMemberS{Value: h}})
			}
		}
	}
	return out, nil
}

// bulkFleet returns devices × perDevice batches of readings each, given
// round-robin across devices (every device's first batch, then second...).
func bulkFleet(devices, perDevice, readings int) []*tablewrite.Items {
	var out []*tablewrite.Items
	for w := range perDevice {
		for d := range devices {
			out = append(out, build(testBatch(fmt.Sprintf("EE:00:00:00:%02X:%02X", d/256, d%256), w, readings, 20), nil))
		}
	}
	return out
}

// checkBulkOrder asserts the write plan's rules on what f applied: a
// batch's marker after all of its readings, each device's markers in the
// order of items, and none after a batch of its device without one.
func checkBulkOrder(t *testing.T, f *bulkDB, items []*tablewrite.Items) {
	t.Helper()
	pos := map[string]int{}
	for i, name := range f.applied {
		pos[name] = i
	}
	lastMarker := map[string]int{}
	gap := map[string]string{} // each device's first batch without a marker
	for _, it := range items {
		m, ok := pos["m "+it.BatchID]
		if !ok {
			if _, seen := gap[it.HardwareID]; !seen {
				gap[it.HardwareID] = it.BatchID
			}
			continue
		}
		if g, ok := gap[it.HardwareID]; ok {
			require.Failf(t, "a device's marker after a gap", "marker of %s written, of %s before it not", it.BatchID, g)
		}
		for _, r := range it.ReadingItems() {
			rp, ok := pos[itemName(f.tables.Readings, r, f.tables)]
			require.True(t, ok, "marker of %s written without all its readings", it.BatchID)
			require.Less(t, rp, m, "reading of %s after its marker", it.BatchID)
		}
		if prev, ok := lastMarker[it.HardwareID]; ok {
			require.Less(t, prev, m, "markers of %s out of order", it.HardwareID)
		}
		lastMarker[it.HardwareID] = m
	}
}

func outcomes(rs []tablewrite.Result) map[tablewrite.Outcome]int {
	out := map[tablewrite.Outcome]int{}
	for _, r := range rs {
		out[r.Outcome]++
	}
	return out
}

func TestWriteBulkPacksReadingsAndMarkersIntoFullRequests(t *testing.T) {
	f := newBulkDB()
	items := bulkFleet(50, 4, 10) // 200 batches, 2,000 readings, 2,200 items
	results := tablewrite.New(f, f.tables, tablewrite.Options{}).WriteBulk(context.Background(), items, 8)
	require.Equal(t, map[tablewrite.Outcome]int{tablewrite.Delivered: 200}, outcomes(results))
	require.Len(t, f.applied, 2200, "every reading and marker once")
	require.Equal(t, 2, f.gets, "200 markers looked up in 2 requests")
	checkBulkOrder(t, f, items)
	full := 0
	for _, r := range f.requests {
		if len(r) == tablewrite.BatchWriteMax {
			full++
		}
	}
	// 2,200 items fill 88 requests; only the last markers may go in
	// requests that are not full.
	require.LessOrEqual(t, len(f.requests), 88+3)
	require.GreaterOrEqual(t, full, 85)
}

func TestWriteLookedUpWritesWithoutALookup(t *testing.T) {
	f := newBulkDB()
	items := bulkFleet(20, 3, 10) // 60 batches, 600 readings, 660 items
	results := tablewrite.New(f, f.tables, tablewrite.Options{}).WriteLookedUp(context.Background(), items, 4)
	require.Equal(t, map[tablewrite.Outcome]int{tablewrite.Delivered: 60}, outcomes(results))
	require.Zero(t, f.gets, "the caller looked the markers up")
	require.Len(t, f.applied, 660, "every reading and marker once")
	checkBulkOrder(t, f, items)
	require.LessOrEqual(t, len(f.requests), 27+3, "660 items fill 27 requests")
}

func TestWriteBulkKeepsOneDevicesMarkersInOrder(t *testing.T) {
	f := newBulkDB()
	items := bulkFleet(1, 60, 3) // one device: its markers form one chain
	results := tablewrite.New(f, f.tables, tablewrite.Options{}).WriteBulk(context.Background(), items, 16)
	require.Equal(t, map[tablewrite.Outcome]int{tablewrite.Delivered: 60}, outcomes(results))
	checkBulkOrder(t, f, items)
	require.LessOrEqual(t, len(f.requests), 20, "a device's queued markers share requests")
}

func TestWriteBulkWritesNothingOfABatchWhoseMarkerExists(t *testing.T) {
	f := newBulkDB()
	items := bulkFleet(3, 2, 5)
	w := tablewrite.New(f, f.tables, tablewrite.Options{})
	require.Equal(t, map[tablewrite.Outcome]int{tablewrite.Delivered: 4}, outcomes(w.WriteBulk(context.Background(), items[:4], 4)))
	// The same four again, and two new ones; one of the four now carries
	// another payload under its batch_id.
	changed := build(testBatch(items[1].HardwareID, 0, 5, 99), nil)
	require.Equal(t, items[1].BatchID, changed.BatchID)
	again := []*tablewrite.Items{items[0], changed, items[2], items[3], items[4], items[5]}
	before := len(f.applied)
	results := w.WriteBulk(context.Background(), again, 4)
	require.Equal(t, tablewrite.Duplicate, results[0].Outcome)
	require.Equal(t, tablewrite.Conflict, results[1].Outcome)
	require.ErrorContains(t, results[1].Err, "another payload")
	require.Equal(t, []tablewrite.Outcome{tablewrite.Duplicate, tablewrite.Duplicate, tablewrite.Delivered, tablewrite.Delivered},
		[]tablewrite.Outcome{results[2].Outcome, results[3].Outcome, results[4].Outcome, results[5].Outcome})
	require.Len(t, f.applied[before:], 12, "only the two new batches' readings and markers")
	checkBulkOrder(t, f, again)
}

func TestWriteBulkFindsTheRefusedBatch(t *testing.T) {
	f := newBulkDB()
	items := bulkFleet(10, 3, 4)
	f.reject = items[13].BatchID // device 3's second batch
	results := tablewrite.New(f, f.tables, tablewrite.Options{}).WriteBulk(context.Background(), items, 4)
	for i, r := range results {
		switch {
		case i == 13:
			require.Equal(t, tablewrite.Rejected, r.Outcome)
		case i == 23: // device 3's third batch waits behind it
			require.Equal(t, tablewrite.Failed, r.Outcome)
			require.ErrorContains(t, r.Err, "waits for batch_id "+items[13].BatchID)
		default:
			require.Equal(t, tablewrite.Delivered, r.Outcome, "batch %d", i)
		}
	}
	_, ok := f.markers[items[23].BatchID]
	require.False(t, ok, "no marker after the refused batch")
	require.False(t, f.stored(items[13].BatchID), "a reading of the refused batch stayed")
	checkBulkOrder(t, f, items)
}

func TestWriteBulkDeletesTheReadingsARefusedBatchHadWritten(t *testing.T) {
	f := newBulkDB()
	// Batches of 10 readings: the third one's readings are split 5 and 5
	// between the first two requests.
	items := bulkFleet(6, 1, 10)
	refused := items[2]
	f.reject = refused.ReadingItems()[7]["ts_batch"].(*types.AttributeValueMemberS).Value
	results := tablewrite.New(f, f.tables, tablewrite.Options{}).WriteBulk(context.Background(), items, 1)
	for i, r := range results {
		if i == 2 {
			require.Equal(t, tablewrite.Rejected, r.Outcome)
			continue
		}
		require.Equal(t, tablewrite.Delivered, r.Outcome, "batch %d", i)
		require.True(t, f.stored(items[i].BatchID))
	}
	written := 0
	for _, name := range f.applied {
		if strings.HasPrefix(name, "r "+refused.BatchID) {
			written++
		}
	}
	require.Equal(t, 5, written, "the request holding its first five readings was accepted")
	require.False(t, f.stored(refused.BatchID), "a reading of the refused batch stayed")
	require.NotContains(t, f.markers, refused.BatchID)
	checkBulkOrder(t, f, items)
}

func TestARefusedBatchWhoseReadingsCannotBeDeletedIsTriedAgain(t *testing.T) {
	f := &deleteFailingDB{bulkDB: newBulkDB()}
	items := bulkFleet(6, 1, 10)
	f.reject = items[2].ReadingItems()[7]["ts_batch"].(*types.AttributeValueMemberS).Value
	results := tablewrite.New(f, f.tables, tablewrite.Options{}).WriteBulk(context.Background(), items, 1)
	require.Equal(t, tablewrite.Failed, results[2].Outcome, "not dead-lettered while part of it is in the table")
	require.ErrorContains(t, results[2].Err, "deleting its readings")
	require.True(t, f.stored(items[2].BatchID))
}

// deleteFailingDB fails every request that deletes.
type deleteFailingDB struct{ *bulkDB }

func (d *deleteFailingDB) BatchWriteItem(ctx context.Context, in *dynamodb.BatchWriteItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.BatchWriteItemOutput, error) {
	for _, reqs := range in.RequestItems {
		for _, r := range reqs {
			if r.DeleteRequest != nil {
				return nil, errors.New("connection reset by peer")
			}
		}
	}
	return d.bulkDB.BatchWriteItem(ctx, in, opts...)
}

func TestWriteBulkHoldsADevicesLaterBatchesBehindAFailure(t *testing.T) {
	f := newBulkDB()
	items := bulkFleet(4, 3, 10)
	f.fail = items[1].BatchID // device 1's first batch
	results := tablewrite.New(f, f.tables, tablewrite.Options{}).WriteBulk(context.Background(), items, 2)
	for i, r := range results {
		if i%4 == 1 {
			require.Equal(t, tablewrite.Failed, r.Outcome, "batch %d", i)
			_, ok := f.markers[items[i].BatchID]
			require.False(t, ok)
			continue
		}
		// Other batches in a request with the failing one fail with it.
		if r.Outcome != tablewrite.Delivered {
			require.Equal(t, tablewrite.Failed, r.Outcome)
		}
	}
	require.Positive(t, outcomes(results)[tablewrite.Delivered])
	checkBulkOrder(t, f, items)
}

func TestWriteBulkResendsUnprocessedItems(t *testing.T) {
	f := newBulkDB()
	items := bulkFleet(5, 2, 10)
	f.unprocessed = items[2].BatchID
	var unprocessed atomic.Int64
	w := tablewrite.New(f, f.tables, tablewrite.Options{Call: func(ctx context.Context, r *tablewrite.Request) error {
		err := r.Send(ctx)
		unprocessed.Add(int64(r.Unprocessed))
		return err
	}})
	results := w.WriteBulk(context.Background(), items, 3)
	require.Equal(t, map[tablewrite.Outcome]int{tablewrite.Delivered: 10}, outcomes(results))
	require.Positive(t, unprocessed.Load())
	require.Len(t, f.applied, 110)
	checkBulkOrder(t, f, items)
}

func TestBulkTakesBatchesWhileItWrites(t *testing.T) {
	f := newBulkDB()
	items := bulkFleet(3, 8, 4)  // each device's 8 batches span several Adds
	f.reject = items[10].BatchID // device 1's fourth batch
	bulk := tablewrite.New(f, f.tables, tablewrite.Options{}).StartBulk(context.Background(), 4)
	for start := 0; start < len(items); start += 5 {
		bulk.Add(items[start:min(start+5, len(items))]...)
	}
	results := bulk.Wait()
	require.Len(t, results, len(items))
	for i, r := range results {
		switch {
		case i == 10:
			require.Equal(t, tablewrite.Rejected, r.Outcome)
		case i%3 == 1 && i > 10: // device 1 after its refused batch
			require.Equal(t, tablewrite.Failed, r.Outcome, "batch %d", i)
			require.NotContains(t, f.markers, items[i].BatchID)
		default:
			require.Equal(t, tablewrite.Delivered, r.Outcome, "batch %d", i)
		}
	}
	checkBulkOrder(t, f, items)
}

func TestBulkHoldsBackABatchAddedAfterItsDeviceFailed(t *testing.T) {
	f := newBulkDB()
	items := bulkFleet(2, 2, 10) // device 0, device 1, device 0, device 1
	f.fail = items[0].BatchID
	ctx := context.Background()
	bulk := tablewrite.New(f, f.tables, tablewrite.Options{}).StartBulk(ctx, 2)
	bulk.Add(items[0])
	require.NoError(t, bulk.WaitBelow(ctx, 1)) // device 0's first batch has failed
	bulk.Add(items[1:]...)
	results := bulk.Wait()
	require.Equal(t, tablewrite.Failed, results[0].Outcome)
	require.Equal(t, tablewrite.Failed, results[2].Outcome, "device 0's later batch overtook its failed one")
	require.ErrorContains(t, results[2].Err, "waits for batch_id "+items[0].BatchID)
	require.NotContains(t, f.markers, items[2].BatchID)
	for _, name := range f.applied {
		require.NotContains(t, name, items[2].BatchID)
	}
	require.Equal(t, tablewrite.Delivered, results[1].Outcome)
	require.Equal(t, tablewrite.Delivered, results[3].Outcome)
}

// gatedDB holds every BatchWriteItem until gate is closed.
type gatedDB struct {
	*bulkDB
	gate chan struct{}
}

func (g *gatedDB) BatchWriteItem(ctx context.Context, in *dynamodb.BatchWriteItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.BatchWriteItemOutput, error) {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.bulkDB.BatchWriteItem(ctx, in, opts...)
}

func TestBulkWaitBelowWaitsForBatchesToBeDecided(t *testing.T) {
	f := &gatedDB{bulkDB: newBulkDB(), gate: make(chan struct{})}
	items := bulkFleet(3, 2, 10)
	bulk := tablewrite.New(f, f.tables, tablewrite.Options{}).StartBulk(context.Background(), 2)
	bulk.Add(items...)
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, bulk.WaitBelow(short, len(items)), context.DeadlineExceeded, "nothing is decided while writes hang")
	f.mu.Lock()
	require.Empty(t, f.applied)
	f.mu.Unlock()
	close(f.gate)
	require.NoError(t, bulk.WaitBelow(context.Background(), 1))
	f.mu.Lock()
	require.Len(t, f.markers, len(items), "every batch decided: every marker written")
	f.mu.Unlock()
	require.Equal(t, map[tablewrite.Outcome]int{tablewrite.Delivered: len(items)}, outcomes(bulk.Wait()))
	// The bulk let go of its copies of the items, not of the caller's.
	for _, it := range items {
		require.Equal(t, 10, it.Readings())
		require.Len(t, it.ReadingItems(), 10)
	}
}

func TestARefusedMarkerLookupFailsItsBatchesWithoutRejectingThem(t *testing.T) {
	f := newBulkDB()
	f.refuseGets = true
	items := bulkFleet(4, 2, 3)
	results := tablewrite.New(f, f.tables, tablewrite.Options{}).WriteBulk(context.Background(), items, 2)
	require.Equal(t, map[tablewrite.Outcome]int{tablewrite.Failed: len(items)}, outcomes(results),
		"a lookup of 100 keys refused is no batch's content refused: none is dead-lettered")
	require.ErrorContains(t, results[0].Err, "BatchGetItem")
	require.Empty(t, f.applied)
}

func TestAMarkerFoundWaitsForTheDevicesEarlierBatches(t *testing.T) {
	f := newBulkDB()
	items := bulkFleet(1, 2, 3) // batches a and b of one device
	a, b := items[0], items[1]
	// Their markers go in one request, and DynamoDB applies b's but
	// never a's.
	f.neverProcessed = "m " + a.BatchID
	w := tablewrite.New(f, f.tables, tablewrite.Options{})
	results := w.WriteBulk(context.Background(), items, 1)
	require.Equal(t, tablewrite.Throttled, results[0].Outcome)
	require.ErrorIs(t, results[1].Err, tablewrite.ErrHeldBack)
	require.Contains(t, f.markers, b.BatchID, "b's marker was applied")
	require.NotContains(t, f.markers, a.BatchID)

	// The next round finds b's marker, but a fails again: b is held
	// back, not recorded before a.
	results = w.WriteBulk(context.Background(), items, 1)
	require.Equal(t, tablewrite.Throttled, results[0].Outcome)
	require.Equal(t, tablewrite.Failed, results[1].Outcome)
	require.ErrorIs(t, results[1].Err, tablewrite.ErrHeldBack)

	f.mu.Lock()
	f.neverProcessed = ""
	f.mu.Unlock()
	results = w.WriteBulk(context.Background(), items, 1)
	require.Equal(t, []tablewrite.Outcome{tablewrite.Delivered, tablewrite.Duplicate}, []tablewrite.Outcome{results[0].Outcome, results[1].Outcome})
}

func TestNothingIsDeletedOfABatchIDDeliveredMeanwhile(t *testing.T) {
	f := newBulkDB()
	items := bulkFleet(2, 1, 3)
	refused := items[1]
	f.reject = refused.BatchID
	w := tablewrite.New(&markerAppearsDB{bulkDB: f, id: refused.BatchID}, f.tables, tablewrite.Options{})
	results := w.WriteBulk(context.Background(), items, 1)
	require.Equal(t, tablewrite.Duplicate, results[1].Outcome, "the marker found decides")
	for _, name := range f.applied {
		require.False(t, strings.HasPrefix(name, "d "), "deleted %s", name)
	}
}

// markerAppearsDB answers a batch's marker from its second lookup on, as
// if another writer had delivered it meanwhile.
type markerAppearsDB struct {
	*bulkDB
	id      string
	lookups atomic.Int32
}

func (m *markerAppearsDB) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	if m.lookups.Add(1) >= 2 {
		m.mu.Lock()
		m.markers[m.id] = ""
		m.mu.Unlock()
	}
	return m.bulkDB.BatchGetItem(ctx, in, opts...)
}

// mapsOnly hides a client's type from the writer, which then sends its
// reading items as attribute maps.
type mapsOnly struct{ *dynamodb.Client }

// TestBulkWritesTheSameItemsEncoded writes the same batches with
// WriteBulk into DynamoDB Local twice, once with reading items given
// encoded and once as attribute maps, and compares the tables.
func TestBulkWritesTheSameItemsEncoded(t *testing.T) {
	client, tables, encoded := localWriter(t)
	require.True(t, tablewrite.Encodes(encoded), "a client of cloud.NewClient takes items encoded")
	mapsTables := dynamotest.Shared(t).NewTables(t)
	maps := tablewrite.New(mapsOnly{client}, mapsTables, tablewrite.Options{})
	require.False(t, tablewrite.Encodes(maps))

	received, now := time.Unix(1_760_000_100, 0), time.Now()
	var batches []tablewrite.Batch
	for d := range 6 {
		for w := range 5 {
			b := testBatch(fmt.Sprintf("02:00:00:00:00:%02X", d), w, 1+(d*5+w)%37, 20.5+float64(w)/3)
			b.Readings[0].SensorStatus["probe"] = `escaped "status" ✓`
			b.Readings[0].TimeSource = contract.TimeSourceGateway
			quality := make([]float64, len(b.Readings))
			for i := range quality {
				quality[i] = float64(i) / 7
			}
			if w%2 == 0 {
				quality = nil
			}
			batches = append(batches, tablewrite.Batch{Batch: b, ReceivedAt: received, Hash: b.IdentityHash(), Quality: quality})
		}
	}
	for _, w := range []*tablewrite.Writer{encoded, maps} {
		items := make([]*tablewrite.Items, len(batches))
		for i, b := range batches {
			items[i] = tablewrite.Build(b, 90*24*time.Hour, now)
		}
		for i, r := range w.WriteBulk(context.Background(), items, 4) {
			require.Equal(t, tablewrite.Delivered, r.Outcome, "batch %d: %v", i, r.Err)
		}
	}
	scan := func(table string) []map[string]types.AttributeValue {
		var out []map[string]types.AttributeValue
		p := dynamodb.NewScanPaginator(client, &dynamodb.ScanInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true)})
		for p.HasMorePages() {
			page, err := p.NextPage(context.Background())
			require.NoError(t, err)
			out = append(out, page.Items...)
		}
		slices.SortFunc(out, func(a, b map[string]types.AttributeValue) int {
			return strings.Compare(fmt.Sprint(a["hardware_id"], a["ts_batch"], a["batch_id"]), fmt.Sprint(b["hardware_id"], b["ts_batch"], b["batch_id"]))
		})
		return out
	}
	got, want := scan(tables.Readings), scan(mapsTables.Readings)
	require.Len(t, want, func() (n int) {
		for _, b := range batches {
			n += len(b.Batch.Readings)
		}
		return n
	}())
	require.Equal(t, want, got)
	require.Equal(t, scan(mapsTables.ProcessedBatches), scan(tables.ProcessedBatches))
}
