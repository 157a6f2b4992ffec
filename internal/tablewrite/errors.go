package tablewrite

import (
	"errors"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// ErrUnprocessed is DynamoDB leaving items of a batch request unprocessed
// after several resends (throttling).
var ErrUnprocessed = errors.New("throttled")

// Throttling reports whether err is DynamoDB asking for less load:
// throughput or request-rate limits, or a 5xx. (ErrUnprocessed is not: the
// request itself succeeded; Caller's first result reports it.)
func Throttling(err error) bool {
	if err == nil {
		return false
	}
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) && re.HTTPStatusCode() >= 500 {
		return true
	}
	var tce *types.TransactionCanceledException
	if errors.As(err, &tce) {
		for _, r := range tce.CancellationReasons {
			switch aws.ToString(r.Code) {
			case "ThrottlingError", "ProvisionedThroughputExceeded":
				return true
			}
		}
		return false
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded",
			"InternalServerError", "ServiceUnavailable":
			return true
		}
	}
	return false
}

// Ambiguous reports whether a failed write may still have been applied:
// its answer was lost (network, timeout, cancelled) or the service failed
// midway (5xx). A refusal (throttling, validation, a condition) was not
// applied.
func Ambiguous(err error) bool {
	if err == nil || errors.Is(err, ErrUnprocessed) {
		return false
	}
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) && re.HTTPStatusCode() >= 500 {
		return true
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "InternalServerError", "ServiceUnavailable":
			return true
		}
		return false
	}
	return true
}
