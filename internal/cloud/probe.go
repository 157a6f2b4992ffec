package cloud

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

// probeSizes are the TransactWriteItems sizes ProbeTransactionLimit tries, in
// order: AWS accepts 100 actions per transaction; older DynamoDB Local releases accept only
// 25 or, like 1.11.478, 10.
var probeSizes = []int{100, 25, 10}

// ProbeTransactionLimit finds how many actions one TransactWriteItems call accepts on the
// client's endpoint, without writing anything. It sends transactions of N ConditionCheck
// actions with attribute_not_exists(batch_id) on distinct keys that do not exist
// (__probe__/<random>/<i>) in table, which must be the processed_batches table, for
// N = 100, 25, 10 in that order, and returns the first N accepted. A ValidationException
// about the number of items means "too many" and the next size is tried; any other error
// (throttling, network, missing table) is returned wrapped, so the caller can retry later.
// The result is one of 100, 25 and 10, not the exact limit: callers chunk by it.
func ProbeTransactionLimit(ctx context.Context, client *dynamodb.Client, table string) (int, error) {
	nonce := make([]byte, 8)
	if _, err := rand.Read(nonce); err != nil {
		return 0, fmt.Errorf("probing transaction limit: %w", err)
	}
	prefix := "__probe__/" + hex.EncodeToString(nonce) + "/"

	var lastErr error
	for _, n := range probeSizes {
		items := make([]types.TransactWriteItem, n)
		for i := range items {
			items[i] = types.TransactWriteItem{ConditionCheck: &types.ConditionCheck{
				TableName: aws.String(table),
				Key: map[string]types.AttributeValue{
					"batch_id": &types.AttributeValueMemberS{Value: fmt.Sprintf("%s%d", prefix, i)},
				},
				ConditionExpression: aws.String("attribute_not_exists(batch_id)"),
			}}
		}
		_, err := client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
		if err == nil {
			return n, nil
		}
		if !TooManyItems(err) {
			return 0, fmt.Errorf("probing transaction limit on %s with %d items: %w", table, n, err)
		}
		lastErr = err
	}
	return 0, fmt.Errorf("probing transaction limit on %s: even %d items are too many: %w",
		table, probeSizes[len(probeSizes)-1], lastErr)
}

// TooManyItems reports whether err is the ValidationException for a transaction with more
// items than the endpoint allows. AWS says "... at 'transactItems' failed to satisfy
// constraint: Member must have length less than or equal to 100", DynamoDB Local 1.11.478
// "Member must have length less than or equal to 10".
func TooManyItems(err error) bool {
	var apiErr smithy.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode() != "ValidationException" {
		return false
	}
	msg := strings.ToLower(apiErr.ErrorMessage())
	return strings.Contains(msg, "length less than or equal to") || strings.Contains(msg, "too many") ||
		strings.Contains(msg, "item count")
}
