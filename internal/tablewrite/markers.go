package tablewrite

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// BatchGetMax is BatchGetItem's key limit.
const BatchGetMax = 100

// MarkerHashes reads the markers of up to BatchGetMax batch_ids with a
// consistent read, resending unprocessed keys a few times. The map holds
// an entry for every marker found: its payload_hash, or "" for a marker
// without one. A batch_id given twice is looked up once (BatchGetItem
// refuses a key named twice).
func (w *Writer) MarkerHashes(ctx context.Context, batchIDs []string) (map[string]string, error) {
	keys := make([]map[string]types.AttributeValue, 0, len(batchIDs))
	seen := make(map[string]bool, len(batchIDs))
	for _, id := range batchIDs {
		if !seen[id] {
			seen[id] = true
			keys = append(keys, map[string]types.AttributeValue{"batch_id": s(id)})
		}
	}
	found := make(map[string]string, len(batchIDs))
	wait := 50 * time.Millisecond
	for attempt := 0; ; attempt++ {
		var out *dynamodb.BatchGetItemOutput
		err := w.call(ctx, "BatchGetItem", 0, func(ctx context.Context, r *Request) error {
			var err error
			out, err = w.db.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{
				RequestItems: map[string]types.KeysAndAttributes{w.tables.ProcessedBatches: {
					Keys:                     keys,
					ConsistentRead:           aws.Bool(true),
					ProjectionExpression:     aws.String("batch_id, #h"),
					ExpressionAttributeNames: map[string]string{"#h": AttrPayloadHash},
				}},
				ReturnConsumedCapacity: w.capacity(),
			})
			if err == nil {
				r.Consumed = units(out.ConsumedCapacity...)
			}
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("BatchGetItem of %d markers: %w", len(keys), err)
		}
		for _, item := range out.Responses[w.tables.ProcessedBatches] {
			if v, ok := item["batch_id"].(*types.AttributeValueMemberS); ok {
				h, _ := item[AttrPayloadHash].(*types.AttributeValueMemberS)
				if h != nil {
					found[v.Value] = h.Value
				} else {
					found[v.Value] = ""
				}
			}
		}
		keys = out.UnprocessedKeys[w.tables.ProcessedBatches].Keys
		if len(keys) == 0 {
			return found, nil
		}
		if attempt == 4 {
			return nil, fmt.Errorf("BatchGetItem: %d markers still unprocessed (throttled): %w", len(keys), ErrUnprocessed)
		}
		if err := Sleep(ctx, Jitter(wait)); err != nil {
			return nil, err
		}
		wait *= 2
	}
}
