package tablewrite

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"greenhouse-gateway/internal/cloud"
)

// BatchWriteMax is BatchWriteItem's item limit.
const BatchWriteMax = 25

const markerCondition = "attribute_not_exists(batch_id)"

// DB is the part of the DynamoDB API the writer uses.
type DB interface {
	BatchGetItem(context.Context, *dynamodb.BatchGetItemInput, ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
	TransactWriteItems(context.Context, *dynamodb.TransactWriteItemsInput, ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
	BatchWriteItem(context.Context, *dynamodb.BatchWriteItemInput, ...func(*dynamodb.Options)) (*dynamodb.BatchWriteItemOutput, error)
	PutItem(context.Context, *dynamodb.PutItemInput, ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
}

// Outcome is what became of one batch.
type Outcome int

const (
	// Delivered: written now.
	Delivered Outcome = iota
	// Duplicate: its marker was there, with the same payload hash or none.
	Duplicate
	// Conflict: its marker was there with another payload hash.
	Conflict
	// Rejected: DynamoDB refused the batch's own items; no retry helps.
	// None of its readings is left in the table (unwrite).
	Rejected
	// Throttled: DynamoDB asked for less load; retry later.
	Throttled
	// Failed: any other error; retry.
	Failed
)

// String is the outcome's name in the readings function's answers.
func (o Outcome) String() string {
	return [...]string{"delivered", "duplicate", "conflict", "rejected", "throttled", "error"}[o]
}

// Result is one batch's outcome; Err explains every outcome but
// Delivered and Duplicate, and wraps the DynamoDB error when there is one.
type Result struct {
	Outcome Outcome
	Err     error
}

// InCloud reports whether the batch is in the tables (written now or before).
func (r Result) InCloud() bool { return r.Outcome == Delivered || r.Outcome == Duplicate }

// Request is one DynamoDB request of the writer, as its Caller runs it:
// Send sends it and fills in what the answer said.
type Request struct {
	// Op is the DynamoDB operation.
	Op string
	// Items is a BatchWriteItem's number of items at its first sending
	// (0 when it resends what the answer left unprocessed, and for other
	// operations).
	Items int
	// Send sends the request once.
	Send func(context.Context) error

	// Partly is set by Send when the request succeeded but left items
	// unprocessed (throttling of part of it), Unprocessed to how many.
	Partly      bool
	Unprocessed int
	// Consumed is the capacity units DynamoDB reported (with
	// Options.ConsumedCapacity).
	Consumed float64
	// Refused is set by Send when DynamoDB refused the request's shape or
	// the endpoint's limits (the batches are Failed, to be retried; with
	// CauseTransactionLimit the caller's limit is too high).
	Refused *RequestRefusedError
}

// Caller runs one request (r.Send) and returns its error. The uplink's
// Caller bounds requests in flight by AIMD and records each request's
// figures in its metrics.
type Caller func(ctx context.Context, r *Request) error

// Options configure the writer; the zero value sends each request
// directly and asks for no consumed capacity.
type Options struct {
	// Call runs each request (nil: directly).
	Call Caller
	// ConsumedCapacity makes requests ask for ReturnConsumedCapacity
	// TOTAL; each Request carries the units.
	ConsumedCapacity bool
}

// Writer writes batches to the tables. It is safe for concurrent use.
type Writer struct {
	db     DB
	tables cloud.Tables
	opts   Options
	// encodes: db is a client of cloud.NewClient, whose BatchWriteItem
	// takes reading items given encoded (cloud.EncodedItem).
	encodes bool
}

// New returns a writer for tables through db; it does no I/O.
func New(db DB, tables cloud.Tables, opts Options) *Writer {
	if opts.Call == nil {
		opts.Call = func(ctx context.Context, r *Request) error { return r.Send(ctx) }
	}
	w := &Writer{db: db, tables: tables, opts: opts}
	if c, ok := db.(*dynamodb.Client); ok {
		w.encodes = cloud.EncodesItems(c)
	}
	return w
}

// call runs request r of operation op through the Caller; f sends it and
// notes the answer's figures in r. A refusal of the request's shape or of
// the endpoint's limits is noted in r.Refused.
func (w *Writer) call(ctx context.Context, op string, items int, f func(context.Context, *Request) error) error {
	r := &Request{Op: op, Items: items}
	r.Send = func(ctx context.Context) error {
		err := f(ctx, r)
		if err != nil {
			_, r.Refused = refusal(op, err)
		}
		return err
	}
	return w.opts.Call(ctx, r)
}

// Write writes one batch: in one transaction when its readings and marker
// fit txLimit actions, readings first and marker last otherwise. Before
// readings that go ahead of the marker, the marker is looked up, so that
// another payload under a batch_id already delivered (Conflict) does not
// overwrite the readings the table holds.
//
// A transaction the endpoint refuses for its number of actions is written
// the split way at once: the limit was too high (Request.Refused, CauseTransactionLimit).
func (w *Writer) Write(ctx context.Context, it *Items, txLimit int) Result {
	if it.Readings()+1 <= txLimit {
		r := w.writeTransaction(ctx, it)
		if refused := (*RequestRefusedError)(nil); r.Outcome != Failed || !errors.As(r.Err, &refused) ||
			refused.Cause != CauseTransactionLimit {
			return r
		}
	}
	if r, decided := w.markerDecides(ctx, it); decided {
		return r
	}
	return w.WriteSplit(ctx, it)
}

func (w *Writer) writeTransaction(ctx context.Context, it *Items) Result {
	items := make([]types.TransactWriteItem, 0, it.Readings()+1)
	for _, r := range it.readingMaps() {
		items = append(items, types.TransactWriteItem{Put: &types.Put{TableName: aws.String(w.tables.Readings), Item: r}})
	}
	items = append(items, types.TransactWriteItem{Put: &types.Put{
		TableName:           aws.String(w.tables.ProcessedBatches),
		Item:                it.marker,
		ConditionExpression: aws.String(markerCondition),
	}})
	err := w.call(ctx, "TransactWriteItems", 0, func(ctx context.Context, r *Request) error {
		out, err := w.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items,
			ReturnConsumedCapacity: w.capacity()})
		if err == nil {
			r.Consumed = units(out.ConsumedCapacity...)
		}
		return err
	})
	if err == nil {
		return Result{Outcome: Delivered}
	}
	var tce *types.TransactionCanceledException
	if errors.As(err, &tce) && markerAlreadyExists(tce, len(items)-1) {
		return w.existing(ctx, it)
	}
	r := w.classify("TransactWriteItems", it.BatchID, err)
	if r.Outcome == Rejected {
		// An earlier attempt that went another way (a bulk write, a
		// split write) may have left some of its readings.
		return w.unwrite(ctx, it, r)
	}
	return r
}

// markerAlreadyExists reports whether a cancelled transaction failed only
// because the marker at index markerIdx exists. Older DynamoDB Local
// releases give the reasons only in the message ("... [None, ...,
// ConditionalCheckFailed]").
func markerAlreadyExists(tce *types.TransactionCanceledException, markerIdx int) bool {
	codes := make([]string, 0, len(tce.CancellationReasons))
	for _, r := range tce.CancellationReasons {
		codes = append(codes, aws.ToString(r.Code))
	}
	if len(codes) == 0 {
		msg := aws.ToString(tce.Message)
		open, end := strings.LastIndex(msg, "["), strings.LastIndex(msg, "]")
		if open < 0 || end < open {
			return false
		}
		for _, c := range strings.Split(msg[open+1:end], ",") {
			codes = append(codes, strings.TrimSpace(c))
		}
	}
	if len(codes) <= markerIdx || codes[markerIdx] != "ConditionalCheckFailed" {
		return false
	}
	for i, c := range codes {
		if i != markerIdx && c != "" && c != "None" {
			return false
		}
	}
	return true
}

// WriteSplit writes the readings with BatchWriteItem, then the marker.
func (w *Writer) WriteSplit(ctx context.Context, it *Items) Result {
	var (
		r       Result
		written bool
	)
	if failedAt, err := w.readingRequests(ctx, it, func(item map[string]types.AttributeValue) types.WriteRequest {
		return types.WriteRequest{PutRequest: &types.PutRequest{Item: item}}
	}); err != nil {
		r, written = w.classify("BatchWriteItem", it.BatchID, err), failedAt > 0
	} else {
		r, written = w.putMarker(ctx, it), true
	}
	if r.Outcome == Rejected && written {
		return w.unwrite(ctx, it, r)
	}
	return r
}

// readingRequests sends it's readings BatchWriteMax to a BatchWriteItem,
// each as req makes it, and stops at the first request that fails: it
// returns that request's first reading and its error.
func (w *Writer) readingRequests(ctx context.Context, it *Items, req func(map[string]types.AttributeValue) types.WriteRequest) (int, error) {
	maps := it.readingMaps()
	for start := 0; start < len(maps); start += BatchWriteMax {
		reqs := make([]types.WriteRequest, 0, BatchWriteMax)
		for _, item := range maps[start:min(start+BatchWriteMax, len(maps))] {
			reqs = append(reqs, req(item))
		}
		if err := w.batchWrite(ctx, reqs); err != nil {
			return start, err
		}
	}
	return 0, nil
}

// unwrite deletes the readings of it, a batch DynamoDB refused (r) after
// requests it accepted, now or in an earlier attempt, may have written
// some of them: a refused batch leaves none of its readings in the table.
// A reading's key holds its batch_id, so no other batch's reading is
// touched; and when a marker of the batch_id is found first (another
// writer delivered it meanwhile), nothing is deleted and the marker
// decides (Duplicate or Conflict). When the lookup or the deletes fail,
// the batch is Failed rather than Rejected: it is tried again, refused
// again, and its readings deleted then.
func (w *Writer) unwrite(ctx context.Context, it *Items, r Result) Result {
	if found, decided := w.markerDecides(ctx, it); decided {
		if found.Outcome == Throttled || found.Outcome == Failed { // the lookup failed
			found.Err = fmt.Errorf("%w; looking up its marker before deleting its readings: %w", r.Err, found.Err)
		}
		return found
	}
	if _, err := w.readingRequests(ctx, it, func(item map[string]types.AttributeValue) types.WriteRequest {
		return types.WriteRequest{DeleteRequest: &types.DeleteRequest{Key: map[string]types.AttributeValue{
			"hardware_id": item["hardware_id"], "ts_batch": item["ts_batch"]}}}
	}); err != nil {
		res := w.notRefused("BatchWriteItem", it.BatchID, err)
		res.Err = fmt.Errorf("%w; deleting its readings that were written: %w", r.Err, res.Err)
		return res
	}
	return r
}

// putMarker writes a batch's processed_batches marker, on condition that
// it does not exist yet; an existing marker means the batch was written
// before (or another payload under its batch_id).
func (w *Writer) putMarker(ctx context.Context, it *Items) Result {
	err := w.call(ctx, "PutItem", 0, func(ctx context.Context, r *Request) error {
		out, err := w.db.PutItem(ctx, &dynamodb.PutItemInput{
			TableName:              aws.String(w.tables.ProcessedBatches),
			Item:                   it.marker,
			ConditionExpression:    aws.String(markerCondition),
			ReturnConsumedCapacity: w.capacity(),
		})
		if err == nil && out.ConsumedCapacity != nil {
			r.Consumed = units(*out.ConsumedCapacity)
		}
		return err
	})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case err == nil:
		return Result{Outcome: Delivered}
	case errors.As(err, &ccf):
		return w.existing(ctx, it)
	}
	return w.classify("PutItem", it.BatchID, err)
}

// existing reads the marker that made the write fail and compares its
// payload hash with the batch's.
func (w *Writer) existing(ctx context.Context, it *Items) Result {
	if it.hash == "" {
		return Result{Outcome: Duplicate}
	}
	if r, decided := w.markerDecides(ctx, it); decided {
		return r
	}
	return compareHash(it, "") // gone since (its TTL): no payload to compare
}

// markerDecides looks batch it's marker up. A marker found decides the
// batch (Duplicate or Conflict, compareHash), and so does a failed lookup
// (Throttled or Failed, notRefused); decided is false when there is no
// marker.
func (w *Writer) markerDecides(ctx context.Context, it *Items) (r Result, decided bool) {
	stored, err := w.MarkerHashes(ctx, []string{it.BatchID})
	if err != nil {
		return w.notRefused("BatchGetItem", it.BatchID, err), true
	}
	h, ok := stored[it.BatchID]
	if !ok {
		return Result{}, false
	}
	return compareHash(it, h), true
}

// batchWrite writes up to 25 readings, resending unprocessed ones a few
// times before giving up with ErrUnprocessed.
func (w *Writer) batchWrite(ctx context.Context, reqs []types.WriteRequest) error {
	return w.resend(ctx, reqs, nil, func(ctx context.Context, readings, _ []types.WriteRequest) (*dynamodb.BatchWriteItemOutput, error) {
		return w.db.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{
			RequestItems:           map[string][]types.WriteRequest{w.tables.Readings: readings},
			ReturnConsumedCapacity: w.capacity(),
		})
	})
}

// classify turns a request error into its outcome: Rejected only for a
// refusal of the batch's own content; Failed for a refusal of the
// request's shape or the endpoint's limits (a RequestRefusedError, also
// noted in the Request its Caller ran), Throttled or Failed for the rest.
func (w *Writer) classify(op, batchID string, err error) Result {
	content, refused := refusal(op, err)
	if refused != nil {
		err = refused
	}
	err = fmt.Errorf("%s for %s: %w", op, batchID, err)
	switch {
	case content:
		return Result{Outcome: Rejected, Err: err}
	case refused != nil:
		return Result{Outcome: Failed, Err: err}
	case Throttling(err) || errors.Is(err, ErrUnprocessed):
		return Result{Outcome: Throttled, Err: err}
	}
	return Result{Outcome: Failed, Err: err}
}

// notRefused is classify for a request whose refusal is no refusal of the
// batch's content (a marker lookup, the deletes of its readings):
// Throttled or Failed, never Rejected.
func (w *Writer) notRefused(op, batchID string, err error) Result {
	r := w.classify(op, batchID, err)
	if r.Outcome == Rejected {
		r.Outcome = Failed
	}
	return r
}

// Jitter returns a duration between d/2 and d.
func Jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2)
}

// Sleep waits d, or until ctx is done (its error).
func Sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
