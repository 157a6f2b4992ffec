package tablewrite

import (
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"greenhouse-gateway/internal/cloud"
)

// The causes of a RequestRefusedError: DynamoDB refused a request for
// something else than the batch's own content.
const (
	// CauseTransactionLimit: more actions in one TransactWriteItems than
	// the endpoint takes (AWS: 100, DynamoDB Local 1.11.478: 10).
	CauseTransactionLimit = "transaction_limit"
	// CauseRequestLimit: another limit of the request or the endpoint (an
	// item count, a request's size).
	CauseRequestLimit = "request_limit"
	// CauseParameter: a parameter, value or expression of the request the
	// endpoint does not take.
	CauseParameter = "parameter"
	// CauseRequest: any other ValidationException that does not say it is
	// about the items' content (the table's key schema, an expression).
	CauseRequest = "request"
)

// RefusalCauses are the causes, for metrics that start at 0.
var RefusalCauses = []string{CauseTransactionLimit, CauseRequestLimit, CauseParameter, CauseRequest}

// RequestRefusedError is DynamoDB refusing a request's shape or the
// endpoint's limits rather than the batch's content: the batch is retried
// (Failed), never Rejected, since nothing in it is wrong.
type RequestRefusedError struct {
	Op    string
	Cause string // one of RefusalCauses
	Err   error
}

func (e *RequestRefusedError) Error() string {
	return fmt.Sprintf("DynamoDB refused the %s request (%s), not the batch: %v", e.Op, e.Cause, e.Err)
}

func (e *RequestRefusedError) Unwrap() error { return e.Err }

// contentMessages are the ValidationException messages (lowercase parts)
// that refuse an item's own data, which no retry or other request shape
// can store: an item over 400 KB, a number out of DynamoDB's range or
// precision. Every other ValidationException is taken for a refusal of
// the request: a batch wrongly retried waits in the buffer, where an
// operator sees it; a batch wrongly rejected is lost.
var contentMessages = []string{
	"item size has exceeded",           // "Item size has exceeded the maximum allowed size"
	"item size to update has exceeded", // the same for an update
	"number overflow",                  // "Number overflow. Attempting to store a number with magnitude larger than supported range"
	"number underflow",                 // "... smaller than supported range"
	"significant digits",               // "Attempting to store more than 38 significant digits in a Number"
}

// contentRefused reports whether a ValidationException's message refuses
// an item's content (contentMessages).
func contentRefused(msg string) bool {
	msg = strings.ToLower(msg)
	for _, m := range contentMessages {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// refusal sorts a DynamoDB error of request op: content is true when it
// refuses the items' content (a ValidationException of contentMessages,
// or a transaction cancelled for such a ValidationError); refused is set
// when it is a ValidationException of anything else. Both are zero for
// other errors (throttling, network, conditions).
func refusal(op string, err error) (content bool, refused *RequestRefusedError) {
	var tce *types.TransactionCanceledException
	if errors.As(err, &tce) {
		for _, r := range tce.CancellationReasons {
			if aws.ToString(r.Code) == "ValidationError" && contentRefused(aws.ToString(r.Message)) {
				return true, nil
			}
		}
		return false, nil
	}
	var ae smithy.APIError
	if !errors.As(err, &ae) || ae.ErrorCode() != "ValidationException" {
		return false, nil
	}
	msg := ae.ErrorMessage()
	if contentRefused(msg) {
		return true, nil
	}
	return false, &RequestRefusedError{Op: op, Cause: refusalCause(op, err, strings.ToLower(msg)), Err: err}
}

// refusalCause names why a request was refused (RefusalCauses); msg is
// the error's message in lowercase.
func refusalCause(op string, err error, msg string) string {
	has := func(parts ...string) bool {
		for _, p := range parts {
			if strings.Contains(msg, p) {
				return true
			}
		}
		return false
	}
	switch {
	case op == "TransactWriteItems" && cloud.TooManyItems(err):
		return CauseTransactionLimit
	case has("length less than or equal to", "too many", "item count", "request size", "size exceeded",
		"larger than", "too large", "exceeds", "limit"):
		return CauseRequestLimit
	case has("unsupported", "not supported", "unknown parameter", "invalid parameter", "not recognized",
		"failed to satisfy constraint: member must satisfy enum"):
		return CauseParameter
	}
	return CauseRequest
}

// isolates reports whether a request of several batches that ended in r
// is sent again one batch at a time: DynamoDB refused it, for the content
// of one of them (which one is refused) or for its shape, which the
// batches together may have made (two batches with the same keys).
func (r Result) isolates() bool {
	var refused *RequestRefusedError
	return r.Outcome == Rejected || errors.As(r.Err, &refused)
}
