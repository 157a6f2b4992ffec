package function

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"greenhouse-gateway/internal/cloud"
)

// A request's answer is kept for replays of its Idempotency-Key (or body
// request_id) in processed_batches, the schema's idempotency table, under
// a reserved key: RequestKeyPrefix, then the hex SHA-256 of the API key's
// key_id and the Idempotency-Key. No batch_id can collide with it: '#'
// is outside the batch_id charset. The item carries the table's required
// attributes (hardware_id "-", received_at, expiration_time, which TTL
// honours) and the optional request_hash, status_code and response.
const RequestKeyPrefix = "#request#"

// maxIdempotencyKey bounds an Idempotency-Key.
const maxIdempotencyKey = 256

// idempotent answers POST /v1/readings, or the stored answer of an earlier
// request with the same key and Idempotency-Key. Only final answers are
// stored: a 429 or 503 is answered again by doing the work again.
func (f *Function) idempotent(ctx context.Context, key cloud.KeyInfo, header string, body []byte) answer {
	requestID, batches, err := splitRequestID(body)
	if err != nil {
		return requestError(http.StatusBadRequest, err.Error())
	}
	idem := cmp.Or(header, requestID)
	if idem == "" {
		return f.readings(ctx, key, batches)
	}
	if len(idem) > maxIdempotencyKey {
		return requestError(http.StatusBadRequest, fmt.Sprintf("Idempotency-Key: must be at most %d characters", maxIdempotencyKey))
	}
	sum := sha256.Sum256([]byte(key.KeyID + "\n" + idem))
	rk := RequestKeyPrefix + hex.EncodeToString(sum[:])
	bodySum := sha256.Sum256(body)
	bodyHash := hex.EncodeToString(bodySum[:])
	if a, found, err := f.storedAnswer(ctx, rk, bodyHash); err != nil {
		f.logger.Warn("an Idempotency-Key could not be looked up", "err", err)
		return requestError(http.StatusServiceUnavailable, "the Idempotency-Key cannot be looked up now; retry later")
	} else if found {
		return a
	}
	a := f.readings(ctx, key, batches)
	if a.code == http.StatusTooManyRequests || a.code == http.StatusServiceUnavailable {
		return a
	}
	stored, err := f.storeAnswer(ctx, rk, bodyHash, a)
	if err != nil {
		f.logger.Warn("the answer of an Idempotency-Key was not stored", "err", err)
		return a
	}
	return stored
}

// splitRequestID takes the optional request_id out of a
// {"request_id":"...","batches":[...]} body.
func splitRequestID(body []byte) (string, []byte, error) {
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil || len(top) != 2 || top["request_id"] == nil || top["batches"] == nil {
		return "", body, nil
	}
	var id string
	if err := json.Unmarshal(top["request_id"], &id); err != nil || id == "" {
		return "", nil, errors.New("request_id: must be a non-empty string")
	}
	rest, err := json.Marshal(map[string]json.RawMessage{"batches": top["batches"]})
	return id, rest, err
}

// storedAnswer reads the answer stored under rk. A stored answer to
// another body is a 409.
func (f *Function) storedAnswer(ctx context.Context, rk, bodyHash string) (answer, bool, error) {
	out, err := f.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(f.cfg.Tables.ProcessedBatches),
		Key:            map[string]types.AttributeValue{"batch_id": &types.AttributeValueMemberS{Value: rk}},
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return answer{}, false, fmt.Errorf("GetItem of a request record: %w", err)
	}
	if out.Item == nil {
		return answer{}, false, nil
	}
	h, _ := out.Item["request_hash"].(*types.AttributeValueMemberS)
	code, _ := out.Item["status_code"].(*types.AttributeValueMemberN)
	resp, _ := out.Item["response"].(*types.AttributeValueMemberS)
	if h == nil || code == nil || resp == nil {
		return answer{}, false, errors.New("a request record lacks request_hash, status_code or response")
	}
	if h.Value != bodyHash {
		return requestError(http.StatusConflict, "Idempotency-Key: was used before with another request body"), true, nil
	}
	n, err := strconv.Atoi(code.Value)
	if err != nil {
		return answer{}, false, fmt.Errorf("a request record's status_code %q: %w", code.Value, err)
	}
	return jsonAnswer(n, json.RawMessage(resp.Value)), true, nil
}

// storeAnswer stores a's answer under rk unless one is there already (a
// concurrent request with the same key won), and returns the stored one.
func (f *Function) storeAnswer(ctx context.Context, rk, bodyHash string, a answer) (answer, error) {
	body, err := json.Marshal(a.body)
	if err != nil {
		return a, fmt.Errorf("encoding the answer: %w", err)
	}
	now := f.now()
	_, err = f.db.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(f.cfg.Tables.ProcessedBatches),
		Item: map[string]types.AttributeValue{
			"batch_id":        &types.AttributeValueMemberS{Value: rk},
			"hardware_id":     &types.AttributeValueMemberS{Value: "-"},
			"received_at":     &types.AttributeValueMemberS{Value: cloud.FormatTime(now)},
			"expiration_time": &types.AttributeValueMemberN{Value: strconv.FormatInt(now.Add(f.cfg.IdempotencyTTL).Unix(), 10)},
			"request_hash":    &types.AttributeValueMemberS{Value: bodyHash},
			"status_code":     &types.AttributeValueMemberN{Value: strconv.Itoa(a.code)},
			"response":        &types.AttributeValueMemberS{Value: string(body)},
		},
		ConditionExpression: aws.String("attribute_not_exists(batch_id)"),
	})
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		stored, found, err := f.storedAnswer(ctx, rk, bodyHash)
		if err != nil || !found {
			return a, cmp.Or(err, errors.New("the request record vanished"))
		}
		return stored, nil
	}
	if err != nil {
		return a, fmt.Errorf("PutItem of a request record: %w", err)
	}
	return a, nil
}
