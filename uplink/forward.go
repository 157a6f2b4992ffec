package uplink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"greenhouse-gateway/buffer"
)

// batchWriteMax is BatchWriteItem's item limit.
const batchWriteMax = 25

// permanentError is a refusal no retry can change.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

const markerCondition = "attribute_not_exists(batch_id)"

// forward sends one batch. nil means the batch is in the cloud (written now
// or before); the batch is then returned with its reading times, for the
// buffer's history.
func (u *Uplink) forward(ctx context.Context, p buffer.Pending, limit int) (buffer.Pending, error) {
	cb, err := buildBatch(p, u.cfg.ReadingsRetention, u.clock.Now())
	if err != nil {
		// The buffer only holds payloads the gateway validated and encoded
		// itself, so this is damage on disk: keep it for an operator.
		return p, &permanentError{err: err}
	}
	if len(cb.readings)+1 <= limit {
		err = u.forwardTransaction(ctx, cb)
	} else {
		err = u.forwardSplit(ctx, cb)
	}
	if err != nil {
		return p, err
	}
	u.metrics.readings.Add(float64(len(cb.readings)))
	return cb.pending, nil
}

func (u *Uplink) forwardTransaction(ctx context.Context, cb *cloudBatch) error {
	items := make([]types.TransactWriteItem, 0, len(cb.readings)+1)
	for _, r := range cb.readings {
		items = append(items, types.TransactWriteItem{Put: &types.Put{TableName: aws.String(u.tables.Readings), Item: r}})
	}
	items = append(items, types.TransactWriteItem{Put: &types.Put{
		TableName:           aws.String(u.tables.ProcessedBatches),
		Item:                cb.marker,
		ConditionExpression: aws.String(markerCondition),
	}})
	err := u.call(ctx, "TransactWriteItems", func(ctx context.Context) error {
		_, err := u.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
		return err
	})
	if err == nil {
		u.metrics.batches.WithLabelValues("delivered").Inc()
		return nil
	}
	var tce *types.TransactionCanceledException
	if errors.As(err, &tce) && markerAlreadyExists(tce, len(items)-1) {
		u.metrics.batches.WithLabelValues("already_delivered").Inc()
		return nil
	}
	return u.classify("TransactWriteItems", cb.pending.BatchID, err)
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

// forwardSplit writes the readings with BatchWriteItem, then the marker.
func (u *Uplink) forwardSplit(ctx context.Context, cb *cloudBatch) error {
	for start := 0; start < len(cb.readings); start += batchWriteMax {
		reqs := make([]types.WriteRequest, 0, batchWriteMax)
		for _, r := range cb.readings[start:min(start+batchWriteMax, len(cb.readings))] {
			reqs = append(reqs, types.WriteRequest{PutRequest: &types.PutRequest{Item: r}})
		}
		if err := u.batchWrite(ctx, cb.pending.BatchID, reqs); err != nil {
			return err
		}
	}
	return u.putMarker(ctx, cb)
}

// putMarker writes a batch's processed_batches marker, on condition that
// it does not exist yet; an existing marker means the batch was delivered
// before.
func (u *Uplink) putMarker(ctx context.Context, cb *cloudBatch) error {
	err := u.call(ctx, "PutItem", func(ctx context.Context) error {
		_, err := u.db.PutItem(ctx, &dynamodb.PutItemInput{
			TableName:           aws.String(u.tables.ProcessedBatches),
			Item:                cb.marker,
			ConditionExpression: aws.String(markerCondition),
		})
		return err
	})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case err == nil:
		u.metrics.batches.WithLabelValues("delivered").Inc()
		return nil
	case errors.As(err, &ccf):
		u.metrics.batches.WithLabelValues("already_delivered").Inc()
		return nil
	}
	return u.classify("PutItem", cb.pending.BatchID, err)
}

// batchWrite writes up to 25 items, resending unprocessed ones a few times
// before giving the round up to the backoff.
func (u *Uplink) batchWrite(ctx context.Context, batchID string, reqs []types.WriteRequest) error {
	wait := 50 * time.Millisecond
	u.metrics.requestItems.Observe(float64(len(reqs)))
	for attempt := 0; ; attempt++ {
		var out *dynamodb.BatchWriteItemOutput
		err := u.callOutcome(ctx, "BatchWriteItem", func(ctx context.Context) (bool, error) {
			var err error
			out, err = u.db.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{
				RequestItems: map[string][]types.WriteRequest{u.tables.Readings: reqs},
			})
			// Unprocessed items are DynamoDB throttling part of a request.
			return err == nil && len(out.UnprocessedItems[u.tables.Readings]) > 0, err
		})
		if err != nil {
			return u.classify("BatchWriteItem", batchID, err)
		}
		reqs = out.UnprocessedItems[u.tables.Readings]
		if len(reqs) == 0 {
			return nil
		}
		u.metrics.unprocessed.Add(float64(len(reqs)))
		if attempt == 4 {
			return fmt.Errorf("BatchWriteItem for %s: %d items still unprocessed: %w", batchID, len(reqs), errUnprocessed)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(jitter(wait)):
		}
		wait *= 2
	}
}

// errUnprocessed is DynamoDB leaving items of a batch request unprocessed
// after several resends (throttling).
var errUnprocessed = errors.New("throttled")

// call runs one request with the request timeout, within the AIMD limit of
// requests in flight, and records its latency.
func (u *Uplink) call(ctx context.Context, op string, f func(context.Context) error) error {
	return u.callOutcome(ctx, op, func(ctx context.Context) (bool, error) { return false, f(ctx) })
}

// callOutcome is call for a request that can succeed and still report
// throttling (f's first result).
func (u *Uplink) callOutcome(ctx context.Context, op string, f func(context.Context) (bool, error)) error {
	gen, err := u.limiter.acquire(ctx)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, u.cfg.RequestTimeout)
	defer cancel()
	start := time.Now()
	partly, err := f(ctx)
	u.metrics.requestSeconds.WithLabelValues(op).Observe(time.Since(start).Seconds())
	o := outcomeSuccess
	switch {
	case partly || throttled(err):
		o = outcomeThrottled
	case err != nil:
		o = outcomeOther
	}
	u.limiter.release(gen, o)
	if err != nil {
		u.metrics.requestErrors.WithLabelValues(op, errorKind(err)).Inc()
	}
	return err
}

// classify turns a request error into a retryable error, or a
// permanentError for refusals of the batch's own content.
func (u *Uplink) classify(op, batchID string, err error) error {
	var ae smithy.APIError
	if errors.As(err, &ae) && ae.ErrorCode() == "ValidationException" {
		msg := ae.ErrorMessage()
		if strings.Contains(msg, "ransactItems") || strings.Contains(msg, "item count") {
			// The endpoint takes fewer actions per transaction than we
			// thought: probe again rather than blame the batch.
			u.forgetLimit()
			return fmt.Errorf("%s for %s: %w", op, batchID, err)
		}
		return &permanentError{err: fmt.Errorf("%s for %s: %w", op, batchID, err)}
	}
	return fmt.Errorf("%s for %s: %w", op, batchID, err)
}

// errorKind labels a request error for metrics.
func errorKind(err error) string {
	var ae smithy.APIError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.As(err, &ae):
		switch code := ae.ErrorCode(); code {
		case "TransactionCanceledException", "ConditionalCheckFailedException",
			"ProvisionedThroughputExceededException", "ThrottlingException",
			"RequestLimitExceeded", "ValidationException", "ResourceNotFoundException",
			"InternalServerError", "ServiceUnavailable", "UnrecognizedClientException",
			"AccessDeniedException", "InvalidSignatureException", "TransactionConflictException":
			return code
		default:
			return "other_api_error"
		}
	}
	return "network"
}
