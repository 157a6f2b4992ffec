package function

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/tablewrite"
)

// A request's answer is kept for replays of its Idempotency-Key (or body
// request_id) in processed_batches, the schema's idempotency table, under
// a reserved key: RequestKeyPrefix, then the hex SHA-256 of the API key's
// key_id and the Idempotency-Key. No batch_id can collide with it: '#'
// is outside the batch_id charset. The item carries the table's required
// attributes (hardware_id "-", received_at, expiration_time, which TTL
// honours) and the optional request_hash, and either status_code and
// response (a final answer) or in_progress_until (Unix ms) and
// in_progress_owner (a request doing the work).
const RequestKeyPrefix = "#request#"

// maxIdempotencyKey bounds an Idempotency-Key.
const maxIdempotencyKey = 256

// idempotent answers POST /v1/readings, or the stored answer of an earlier
// request with the same key and Idempotency-Key. The request first puts
// an "in progress" record under the key, on condition that there is none
// (or only a stale one): a concurrent request with the key waits for the
// answer a little (inProgressWait), then gets 409 with Retry-After, and
// never does the work a second time. Only final answers are stored: after
// a 429 or 503, or an answer with a batch told buffer_full, the record's lease is ended, and a retry does the work again.
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
	owner, a, done, err := f.claimRequest(ctx, rk, bodyHash)
	if err != nil {
		f.logger.Warn("an Idempotency-Key could not be looked up", "err", err)
		return requestError(http.StatusServiceUnavailable, "the Idempotency-Key cannot be looked up now; retry later")
	}
	if done {
		return a
	}
	a = f.readings(ctx, key, batches)
	// Not kept: an answer the device is told to resend some of (429, 503,
	// or a 207 with buffer_full results); a replay of it would answer
	// buffer_full until the record expired.
	if a.code == http.StatusTooManyRequests || a.code == http.StatusServiceUnavailable || a.unfinished {
		f.releaseRequest(ctx, rk, bodyHash, owner)
		return a
	}
	stored, err := f.storeAnswer(ctx, rk, owner, bodyHash, a)
	if err != nil {
		// A retry does the work again (its batches are duplicates then)
		// rather than wait for the lease: ending it is conditional on the
		// record still being this request's in-progress one.
		f.logger.Warn("the answer of an Idempotency-Key was not stored", "err", err)
		f.releaseRequest(ctx, rk, bodyHash, owner)
		return a
	}
	return stored
}

// inProgressWait is how long a request waits for the answer of another
// request with its Idempotency-Key before it answers 503 "in progress";
// inProgressPoll is how often it looks meanwhile.
const (
	inProgressWait = time.Second
	inProgressPoll = 100 * time.Millisecond
)

// defaultLease is how long an in-progress record holds its key when the
// invocation has no deadline; with one, it holds until the deadline.
const defaultLease = 5 * time.Minute

// requestRecord is a request record: in progress until its lease ends,
// or final with its answer.
type requestRecord struct {
	hash       string
	inProgress bool
	answer     answer
}

// claimRequest puts an in-progress record under rk and returns its owner
// token; done is set, with the answer to give, when rk holds an answer
// already (or another request body's: 409), or another request with the
// key is still in progress after inProgressWait (503 with Retry-After).
// A record whose lease ended (its request's invocation died) is taken
// over.
func (f *Function) claimRequest(ctx context.Context, rk, bodyHash string) (owner string, a answer, done bool, err error) {
	waitUntil := f.now().Add(inProgressWait)
	for {
		rec, err := f.requestRecord(ctx, rk)
		switch {
		case err != nil:
			return "", answer{}, false, err
		case rec == nil:
			owner, err := f.putInProgress(ctx, rk, bodyHash)
			if errors.Is(err, errClaimed) {
				continue // another request claimed the key first: read its record
			}
			return owner, answer{}, false, err
		case rec.hash != bodyHash:
			return "", requestError(http.StatusConflict, "Idempotency-Key: was used before with another request body"), true, nil
		case !rec.inProgress:
			return "", rec.answer, true, nil
		case !f.now().Before(waitUntil):
			// 503, not 409: firmware drops a batch answered 409
			// (a conflict), and keeps and resends one answered 503.
			a := requestError(http.StatusServiceUnavailable, "Idempotency-Key: a request with this key is in progress; retry later for its answer")
			a.retryAfter = true
			return "", a, true, nil
		}
		if err := tablewrite.Sleep(ctx, inProgressPoll); err != nil {
			return "", answer{}, false, err
		}
	}
}

// errClaimed is a conditional put of an in-progress record that found a
// live record.
var errClaimed = errors.New("the request record exists")

// putInProgress puts an in-progress record under rk, on condition that
// there is none, or one whose lease ended, and returns its owner token.
func (f *Function) putInProgress(ctx context.Context, rk, bodyHash string) (string, error) {
	token := make([]byte, 16)
	if _, err := rand.Read(token); err != nil {
		return "", fmt.Errorf("an in-progress record's owner: %w", err)
	}
	owner := hex.EncodeToString(token)
	now := f.now()
	until := now.Add(defaultLease)
	if d, ok := ctx.Deadline(); ok {
		until = d
	}
	_, err := f.db.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(f.cfg.Tables.ProcessedBatches),
		Item: f.recordItem(rk, bodyHash, now, map[string]types.AttributeValue{
			"in_progress_until": &types.AttributeValueMemberN{Value: strconv.FormatInt(until.UnixMilli(), 10)},
			"in_progress_owner": &types.AttributeValueMemberS{Value: owner},
		}),
		ConditionExpression:       aws.String("attribute_not_exists(batch_id) OR in_progress_until < :now"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":now": &types.AttributeValueMemberN{Value: strconv.FormatInt(now.UnixMilli(), 10)}},
	})
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return "", errClaimed
	}
	if err != nil {
		return "", fmt.Errorf("PutItem of an in-progress request record: %w", err)
	}
	return owner, nil
}

// releaseRequest ends owner's in-progress lease under rk, so that a retry
// does the work (again); when it cannot, the retry waits for the lease to
// end.
func (f *Function) releaseRequest(ctx context.Context, rk, bodyHash, owner string) {
	if err := f.endLease(ctx, rk, bodyHash, owner); err != nil {
		f.logger.Warn("the in-progress record of an Idempotency-Key was not released; a retry waits for its lease", "err", err)
	}
}

// endLease rewrites owner's in-progress record under rk with a lease that
// has ended, which the next request with the key takes over as if there
// were none. A conditional put, not a delete: the function is granted no
// DeleteItem on processed_batches, whose items are the batches' markers.
func (f *Function) endLease(ctx context.Context, rk, bodyHash, owner string) error {
	_, err := f.db.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(f.cfg.Tables.ProcessedBatches),
		Item: f.recordItem(rk, bodyHash, f.now(), map[string]types.AttributeValue{
			"in_progress_until": &types.AttributeValueMemberN{Value: "0"},
			"in_progress_owner": &types.AttributeValueMemberS{Value: owner},
		}),
		ConditionExpression:       aws.String("in_progress_owner = :owner"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":owner": &types.AttributeValueMemberS{Value: owner}},
	})
	var ccf *types.ConditionalCheckFailedException
	if err != nil && !errors.As(err, &ccf) { // taken over since: not ours to release
		return fmt.Errorf("PutItem ending an in-progress request record's lease: %w", err)
	}
	return nil
}

func (f *Function) recordItem(rk, bodyHash string, now time.Time, extra map[string]types.AttributeValue) map[string]types.AttributeValue {
	item := map[string]types.AttributeValue{
		"batch_id":        &types.AttributeValueMemberS{Value: rk},
		"hardware_id":     &types.AttributeValueMemberS{Value: "-"},
		"received_at":     &types.AttributeValueMemberS{Value: cloud.FormatTime(now)},
		"expiration_time": &types.AttributeValueMemberN{Value: strconv.FormatInt(now.Add(f.cfg.IdempotencyTTL).Unix(), 10)},
		"request_hash":    &types.AttributeValueMemberS{Value: bodyHash},
	}
	maps.Copy(item, extra)
	return item
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

// requestRecord reads the request record under rk; nil when there is
// none, or only an in-progress one whose lease ended.
func (f *Function) requestRecord(ctx context.Context, rk string) (*requestRecord, error) {
	out, err := f.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(f.cfg.Tables.ProcessedBatches),
		Key:            map[string]types.AttributeValue{"batch_id": &types.AttributeValueMemberS{Value: rk}},
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, fmt.Errorf("GetItem of a request record: %w", err)
	}
	if out.Item == nil {
		return nil, nil
	}
	h, _ := out.Item["request_hash"].(*types.AttributeValueMemberS)
	if h == nil {
		return nil, errors.New("a request record lacks request_hash")
	}
	if until, ok := out.Item["in_progress_until"].(*types.AttributeValueMemberN); ok {
		ms, err := strconv.ParseInt(until.Value, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("a request record's in_progress_until %q: %w", until.Value, err)
		}
		if ms < f.now().UnixMilli() {
			return nil, nil // its request's invocation died: taken over
		}
		return &requestRecord{hash: h.Value, inProgress: true}, nil
	}
	code, _ := out.Item["status_code"].(*types.AttributeValueMemberN)
	resp, _ := out.Item["response"].(*types.AttributeValueMemberS)
	if code == nil || resp == nil {
		return nil, errors.New("a request record lacks status_code or response")
	}
	n, err := strconv.Atoi(code.Value)
	if err != nil {
		return nil, fmt.Errorf("a request record's status_code %q: %w", code.Value, err)
	}
	return &requestRecord{hash: h.Value, answer: jsonAnswer(n, json.RawMessage(resp.Value))}, nil
}

// storeAnswer replaces owner's in-progress record under rk with a's
// answer. When the record is no longer owner's (its lease ended and
// another request took the key over), the answer stored there, if any,
// is returned instead.
func (f *Function) storeAnswer(ctx context.Context, rk, owner, bodyHash string, a answer) (answer, error) {
	body, err := json.Marshal(a.body)
	if err != nil {
		return a, fmt.Errorf("encoding the answer: %w", err)
	}
	_, err = f.db.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(f.cfg.Tables.ProcessedBatches),
		Item: f.recordItem(rk, bodyHash, f.now(), map[string]types.AttributeValue{
			"status_code": &types.AttributeValueMemberN{Value: strconv.Itoa(a.code)},
			"response":    &types.AttributeValueMemberS{Value: string(body)},
		}),
		ConditionExpression:       aws.String("in_progress_owner = :owner"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":owner": &types.AttributeValueMemberS{Value: owner}},
	})
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		rec, err := f.requestRecord(ctx, rk)
		if err != nil || rec == nil || rec.inProgress || rec.hash != bodyHash {
			return a, cmp.Or(err, errors.New("the request record was taken over by another request"))
		}
		return rec.answer, nil
	}
	if err != nil {
		return a, fmt.Errorf("PutItem of a request record: %w", err)
	}
	return a, nil
}
