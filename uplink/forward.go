package uplink

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"greenhouse-gateway/internal/tablewrite"
)

// errUnprocessed is DynamoDB leaving items of a batch request unprocessed
// after several resends (throttling).
var errUnprocessed = tablewrite.ErrUnprocessed

// jitter returns a duration between d/2 and d.
var jitter = tablewrite.Jitter

// newWriter returns a table writer whose requests go through the uplink's
// AIMD limit and metrics (request). It is a few words, made where it is
// used.
func (u *Uplink) newWriter() *tablewrite.Writer {
	return tablewrite.New(u.db, u.tables, tablewrite.Options{Call: u.request, ConsumedCapacity: u.cfg.ConsumedCapacity})
}

// request runs one request of the table writer (call) and records its
// figures: its items, the items left unprocessed, the capacity consumed
// and a refusal of its shape or the endpoint's limits (requestRefused).
func (u *Uplink) request(ctx context.Context, r *tablewrite.Request) error {
	if r.Items > 0 {
		u.metrics.requestItems.Observe(float64(r.Items))
	}
	err := u.callOutcome(ctx, r.Op, func(ctx context.Context) (bool, error) {
		err := r.Send(ctx)
		return r.Partly, err
	})
	if r.Unprocessed > 0 {
		u.metrics.unprocessed.Add(float64(r.Unprocessed))
	}
	if r.Consumed > 0 {
		u.metrics.consumed.WithLabelValues(r.Op).Add(r.Consumed)
	}
	if r.Refused != nil {
		u.requestRefused(r.Refused)
	}
	return err
}

// requestRefused counts a refusal of a request's shape or of the
// endpoint's limits, whose batches are retried, and logs the first of
// each operation and cause. A transaction refused for its number of
// actions makes the next round probe the limit again.
func (u *Uplink) requestRefused(e *tablewrite.RequestRefusedError) {
	if e.Cause == tablewrite.CauseTransactionLimit && u.tx != nil {
		u.tx.forgetLimit()
	}
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
