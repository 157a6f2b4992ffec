package tablewrite_test

import (
	"context"
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/tablewrite"
)

// refusingDB answers every transaction with one API error; it holds no
// marker, and takes the split writes and the deletes of a refused batch's
// readings.
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

func (r refusingDB) PutItem(context.Context, *dynamodb.PutItemInput, ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	return &dynamodb.PutItemOutput{}, nil
}

func validation(msg string) error {
	return &smithy.GenericAPIError{Code: "ValidationException", Message: msg}
}

// Only a refusal of the items' own data rejects a batch; a refusal of the
// request's shape or of the endpoint's limits is retried (Failed), told to
// the Caller once, in Request.Refused, with its cause, or, for a transaction with too
// many actions, written the split way at once.
func TestErrorsAreClassified(t *testing.T) {
	for _, tt := range []struct {
		name    string
		err     error
		outcome tablewrite.Outcome
		cause   string // in Request.Refused; "" when none
	}{
		{"item too large", validation("Item size has exceeded the maximum allowed size"), tablewrite.Rejected, ""},
		{"number out of range", validation("Number overflow. Attempting to store a number with magnitude larger than supported range"), tablewrite.Rejected, ""},
		{"number too precise", validation("Attempting to store more than 38 significant digits in a Number"), tablewrite.Rejected, ""},
		{"item too large in a transaction", &types.TransactionCanceledException{Message: aws.String("Transaction cancelled"),
			CancellationReasons: []types.CancellationReason{{Code: aws.String("None")},
				{Code: aws.String("ValidationError"), Message: aws.String("Item size has exceeded the maximum allowed size")}}}, tablewrite.Rejected, ""},
		{"DynamoDB Local's 10 actions", validation("Member must have length less than or equal to 10"), tablewrite.Delivered, tablewrite.CauseTransactionLimit},
		{"AWS's 100 actions", validation("1 validation error detected: Value '[...]' at 'transactItems' failed to satisfy constraint: Member must have length less than or equal to 100"),
			tablewrite.Delivered, tablewrite.CauseTransactionLimit},
		{"request too large", validation("Transaction request cannot be larger than 4 MB"), tablewrite.Failed, tablewrite.CauseRequestLimit},
		{"unsupported parameter", validation("1 validation error detected: Value 'ALL' at 'returnConsumedCapacity' failed to satisfy constraint: Member must satisfy enum value set: [INDEXES, TOTAL, NONE]"),
			tablewrite.Failed, tablewrite.CauseParameter},
		{"key schema", validation("The provided key element does not match the schema"), tablewrite.Failed, tablewrite.CauseRequest},
		{"one item twice", validation("Transaction request cannot include multiple operations on one item"), tablewrite.Failed, tablewrite.CauseRequest},
		{"unknown message", validation("Something DynamoDB has not said before"), tablewrite.Failed, tablewrite.CauseRequest},
		{"throttled", &smithy.GenericAPIError{Code: "ThrottlingException", Message: "slow down"}, tablewrite.Throttled, ""},
		{"network", context.DeadlineExceeded, tablewrite.Failed, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			limitRefused := false
			var refused []*tablewrite.RequestRefusedError
			w := tablewrite.New(refusingDB{err: tt.err}, cloud.TableNames(""), tablewrite.Options{Call: func(ctx context.Context, r *tablewrite.Request) error {
				err := r.Send(ctx)
				if r.Refused != nil {
					refused = append(refused, r.Refused)
					limitRefused = limitRefused || r.Refused.Cause == tablewrite.CauseTransactionLimit
				}
				return err
			}})
			r := w.Write(context.Background(), build(testBatch("EE:00:00:00:15:07", 0, 1, 20), nil), 10)
			require.Equal(t, tt.outcome, r.Outcome, r.Err)
			if tt.outcome != tablewrite.Delivered {
				require.ErrorIs(t, r.Err, tt.err)
			}
			require.Equal(t, tt.cause == tablewrite.CauseTransactionLimit, limitRefused, "refused for the transaction limit")
			if tt.cause == "" {
				require.Empty(t, refused)
				return
			}
			require.Len(t, refused, 1, "told once")
			require.Equal(t, tt.cause, refused[0].Cause)
			require.Equal(t, "TransactWriteItems", refused[0].Op)
			require.ErrorIs(t, refused[0], tt.err)
			var rre *tablewrite.RequestRefusedError
			require.Equal(t, tt.outcome == tablewrite.Failed, errors.As(r.Err, &rre), "a retried refusal says its cause: %v", r.Err)
		})
	}
}

// Against DynamoDB Local's own refusal: a writer told 100 actions per
// transaction writes a 20-reading batch the split way instead of blaming
// the batch.
func TestTransactionLimitRefusalFallsBackToSplitWrites(t *testing.T) {
	local := dynamotest.Shared(t)
	tables := local.NewTables(t)
	client := local.Client(t)
	var refused []*tablewrite.RequestRefusedError
	w := tablewrite.New(client, tables, tablewrite.Options{Call: func(ctx context.Context, r *tablewrite.Request) error {
		err := r.Send(ctx)
		if r.Refused != nil {
			refused = append(refused, r.Refused)
		}
		return err
	}})
	hw := "EE:00:00:00:15:08"
	b := testBatch(hw, 0, 20, 20)
	r := w.Write(context.Background(), build(b, nil), 100)
	require.Equal(t, tablewrite.Delivered, r.Outcome, r.Err)
	require.Len(t, readingsOf(t, client, tables.Readings, hw), 20)
	require.Len(t, refused, 1)
	require.Equal(t, tablewrite.CauseTransactionLimit, refused[0].Cause, refused[0].Error())
	hashes, err := w.MarkerHashes(context.Background(), []string{b.BatchID})
	require.NoError(t, err)
	require.Contains(t, hashes, b.BatchID, "the marker is written after the readings")
}
