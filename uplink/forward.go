package uplink

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/internal/tablewrite"
)

// permanentError is a refusal no retry can change.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// errUnprocessed is DynamoDB leaving items of a batch request unprocessed
// after several resends (throttling).
var errUnprocessed = tablewrite.ErrUnprocessed

// jitter returns a duration between d/2 and d.
var jitter = tablewrite.Jitter

// newWriter returns a table writer whose requests go through the uplink's
// AIMD limit and metrics. It is a few words, made where it is used.
func (u *Uplink) newWriter() *tablewrite.Writer {
	opts := tablewrite.Options{
		Call:         u.callOutcome,
		RequestItems: func(n int) { u.metrics.requestItems.Observe(float64(n)) },
		Unprocessed:  func(n int) { u.metrics.unprocessed.Add(float64(n)) },
		LimitRefused: u.forgetLimit,
		Refused:      u.requestRefused,
	}
	if u.cfg.ConsumedCapacity {
		opts.Consumed = func(op string, units float64) { u.metrics.consumed.WithLabelValues(op).Add(units) }
	}
	return tablewrite.New(u.db, u.tables, opts)
}

// requestRefused counts a refusal of a request's shape or of the
// endpoint's limits, whose batches are retried, and logs the first of
// each operation and cause.
func (u *Uplink) requestRefused(e *tablewrite.RequestRefusedError) {
	u.metrics.refusedRequests.WithLabelValues(e.Op, e.Cause).Inc()
	u.mu.Lock()
	first := !u.refusalsLogged[e.Op+" "+e.Cause]
	if first {
		u.refusalsLogged[e.Op+" "+e.Cause] = true
	}
	u.mu.Unlock()
	if first {
		u.logger.Warn("DynamoDB refused a request, not its batches; they stay buffered and are retried (logged once per operation and cause, counted in gateway_uplink_refused_requests_total)",
			"operation", e.Op, "cause", e.Cause, "err", e.Err)
	}
}

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
	if err := u.outcome(u.newWriter().Write(ctx, cb.items, limit), cb); err != nil {
		return p, err
	}
	return cb.pending, nil
}

// outcome counts a batch's result and turns it into forward's error: nil
// when the batch is in the cloud, a permanentError when the cloud refuses
// it for good (its content, or another payload under its batch_id).
func (u *Uplink) outcome(r tablewrite.Result, cb *cloudBatch) error {
	switch r.Outcome {
	case tablewrite.Delivered:
		u.metrics.batches.WithLabelValues("delivered").Inc()
	case tablewrite.Duplicate:
		u.metrics.batches.WithLabelValues("already_delivered").Inc()
	case tablewrite.Conflict, tablewrite.Rejected:
		return &permanentError{err: r.Err}
	default:
		return r.Err
	}
	u.metrics.readings.Add(float64(cb.readings))
	return nil
}

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
	rtt := time.Since(start)
	u.metrics.requestSeconds.WithLabelValues(op).Observe(rtt.Seconds())
	o := outcomeSuccess
	switch {
	case partly || throttled(err):
		o = outcomeThrottled
	case err != nil:
		o = outcomeOther
	}
	u.limiter.release(gen, o, op, rtt)
	if err != nil {
		u.metrics.requestErrors.WithLabelValues(op, errorKind(err)).Inc()
	}
	return err
}

// unreachable reports whether err is a request that got no answer: it was
// not sent, or its connection failed, or it timed out. An answer of any
// kind (an HTTP status, a DynamoDB error) means the cloud was reached.
func unreachable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	// The SDK wraps a request that got no answer in a ResponseError with
	// status 0.
	var ae smithy.APIError
	var re *smithyhttp.ResponseError
	if errors.As(err, &ae) || (errors.As(err, &re) && re.HTTPStatusCode() != 0) {
		return false
	}
	var se *smithyhttp.RequestSendError
	var ne net.Error
	return errors.As(err, &se) || errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded)
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
