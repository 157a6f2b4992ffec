package tablewrite_test

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/tablewrite"
)

// refusingDB answers every transaction with one API error; it holds no
// marker, and takes the deletes of a refused batch's readings.
type refusingDB struct {
	tablewrite.DB
	err error
}

func (r refusingDB) TransactWriteItems(context.Context, *dynamodb.TransactWriteItemsInput, ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	return nil, r.err
}

func (r refusingDB) BatchGetItem(context.Context, *dynamodb.BatchGetItemInput, ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	return &dynamodb.BatchGetItemOutput{}, nil
}

func (r refusingDB) BatchWriteItem(context.Context, *dynamodb.BatchWriteItemInput, ...func(*dynamodb.Options)) (*dynamodb.BatchWriteItemOutput, error) {
	return &dynamodb.BatchWriteItemOutput{}, nil
}

func TestErrorsAreClassified(t *testing.T) {
	for _, tt := range []struct {
		name    string
		err     error
		outcome tablewrite.Outcome
		refused bool
	}{
		{"content refused", &smithy.GenericAPIError{Code: "ValidationException", Message: "Item size has exceeded the maximum allowed size"}, tablewrite.Rejected, false},
		{"too many actions", &smithy.GenericAPIError{Code: "ValidationException", Message: "Member must have length less than or equal to 10 [TransactItems]"}, tablewrite.Failed, true},
		{"throttled", &smithy.GenericAPIError{Code: "ThrottlingException", Message: "slow down"}, tablewrite.Throttled, false},
		{"network", context.DeadlineExceeded, tablewrite.Failed, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			refused := false
			w := tablewrite.New(refusingDB{err: tt.err}, cloud.TableNames(""), tablewrite.Options{LimitRefused: func() { refused = true }})
			r := w.Write(context.Background(), build(testBatch("EE:00:00:00:15:07", 0, 1, 20), nil), 10)
			require.Equal(t, tt.outcome, r.Outcome, r.Err)
			require.ErrorIs(t, r.Err, tt.err)
			require.Equal(t, tt.refused, refused)
			require.Equal(t, tt.outcome.String() == "rejected", r.Outcome == tablewrite.Rejected)
		})
	}
}
