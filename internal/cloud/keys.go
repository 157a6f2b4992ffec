package cloud

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/uuid"
)

// ErrKeyNotFound is returned (wrapped) when an API key id does not exist.
var ErrKeyNotFound = errors.New("cloud: api key not found")

// rawKeyBytes is the number of random bytes in a raw API key (64 hex characters).
const rawKeyBytes = 32

// apiKeysPartition is the constant gsi1pk of every api_keys item.
const apiKeysPartition = "api_keys"

// Attribute names of the api_keys table.
const (
	attrKeyID       = "key_id"
	attrKeyHash     = "api_key_hash"
	attrCreatedAt   = "created_at"
	attrLastUsedAt  = "last_used_at"
	attrIsActive    = "is_active"
	attrDescription = "description"
	attrHardwareID  = "hardware_id"
	attrGSI1PK      = "gsi1pk"
	attrGSI1SK      = "gsi1sk"
)

// HashKey returns the stored form of a raw API key: the lowercase hex SHA-256 of pepper
// followed by rawKey.
func HashKey(pepper, rawKey string) string {
	sum := sha256.Sum256([]byte(pepper + rawKey))
	return hex.EncodeToString(sum[:])
}

// FormatTime formats t as the schema's metadata timestamps: RFC 3339 in UTC, truncated to
// whole seconds, e.g. 2024-01-15T10:30:00Z.
func FormatTime(t time.Time) string {
	return t.UTC().Truncate(time.Second).Format(time.RFC3339)
}

// KeyInfo describes one API key; the raw key itself is never stored.
type KeyInfo struct {
	// KeyID is the key's UUID v4 identifier.
	KeyID string
	// Hash is HashKey(pepper, raw key).
	Hash string
	// Description is the operator's note; empty when none was given.
	Description string
	// CreatedAt is the creation time (UTC, whole seconds).
	CreatedAt time.Time
	// LastUsedAt is the last recorded use (UTC, whole seconds); zero if never recorded.
	LastUsedAt time.Time
	// Active is false once the key has been revoked.
	Active bool
	// HardwareID, when set, binds the key to one device: it authenticates
	// that hardware_id only (the optional hardware_id attribute). Empty: a
	// fleet key, which any device may use.
	HardwareID string
}

// KeyWrite is a device key to write to api_keys: issued by the gateway at
// a device's enrollment (put), or reset by an operator (Revoked: marked
// inactive). The device keys produce it, the uplink writes it.
type KeyWrite struct {
	Key     KeyInfo
	Revoked bool
}

// Keys manages API keys in the api_keys table. It is safe for concurrent use.
type Keys struct {
	client *dynamodb.Client
	table  string
	pepper string
	now    func() time.Time
}

// NewKeys returns a Keys for table, hashing raw keys with pepper. It does no I/O.
func NewKeys(client *dynamodb.Client, table string, pepper string) *Keys {
	return &Keys{client: client, table: table, pepper: pepper, now: time.Now}
}

// Create makes a new active fleet key (see CreateBound).
func (k *Keys) Create(ctx context.Context, description string) (raw string, info KeyInfo, err error) {
	return k.CreateBound(ctx, description, "")
}

// CreateBound makes a new active key, bound to hardwareID when it is not
// empty, and returns the raw key (64 lowercase hex characters from 32
// random bytes; shown once, never stored) and what is stored of it.
func (k *Keys) CreateBound(ctx context.Context, description, hardwareID string) (raw string, info KeyInfo, err error) {
	raw, info, err = NewKey(k.pepper, k.now())
	if err != nil {
		return "", KeyInfo{}, err
	}
	info.Description, info.HardwareID = description, hardwareID
	if err := k.put(ctx, info); err != nil {
		return "", KeyInfo{}, fmt.Errorf("creating api key %s: %w", info.KeyID, err)
	}
	return raw, info, nil
}

// NewKey mints a raw key and its KeyInfo (active, created at now, hashed
// with pepper) without storing it: a gateway enrolling a device keeps the
// hash and writes it with PutDeviceKey later.
func NewKey(pepper string, now time.Time) (raw string, info KeyInfo, err error) {
	buf := make([]byte, rawKeyBytes)
	if _, err := rand.Read(buf); err != nil {
		return "", KeyInfo{}, fmt.Errorf("generating api key: %w", err)
	}
	raw = hex.EncodeToString(buf)
	id, err := uuid.NewRandom()
	if err != nil {
		return "", KeyInfo{}, fmt.Errorf("generating api key id: %w", err)
	}
	return raw, KeyInfo{KeyID: id.String(), Hash: HashKey(pepper, raw), CreatedAt: now.UTC().Truncate(time.Second),
		Active: true}, nil
}

// put writes a new key item; it fails if the key_id exists.
func (k *Keys) put(ctx context.Context, info KeyInfo) error {
	createdAt := FormatTime(info.CreatedAt)
	item := map[string]types.AttributeValue{
		attrKeyID:     &types.AttributeValueMemberS{Value: info.KeyID},
		attrKeyHash:   &types.AttributeValueMemberS{Value: info.Hash},
		attrCreatedAt: &types.AttributeValueMemberS{Value: createdAt},
		attrIsActive:  &types.AttributeValueMemberBOOL{Value: info.Active},
		attrGSI1PK:    &types.AttributeValueMemberS{Value: apiKeysPartition},
		attrGSI1SK:    &types.AttributeValueMemberS{Value: createdAt},
	}
	if info.Description != "" {
		item[attrDescription] = &types.AttributeValueMemberS{Value: info.Description}
	}
	if info.HardwareID != "" {
		item[attrHardwareID] = &types.AttributeValueMemberS{Value: info.HardwareID}
	}
	_, err := k.client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:           aws.String(k.table),
		Item:                item,
		ConditionExpression: aws.String("attribute_not_exists(key_id)"),
	})
	return err
}

// PutDeviceKey writes a device key a gateway minted (NewKey, bound to a
// hardware_id) to api_keys, unless its key_id is there already: key_ids
// are random UUIDs, so an item with this one is this key's own earlier
// write (a replay after a lost answer), or its revocation
// (RevokeDeviceKey), which must not be undone. It is an UpdateItem, not a
// PutItem, so that a gateway's IAM policy can name every attribute it
// may write.
func (k *Keys) PutDeviceKey(ctx context.Context, info KeyInfo) error {
	if info.HardwareID == "" {
		return fmt.Errorf("writing device key %s: no hardware_id", info.KeyID)
	}
	createdAt := FormatTime(info.CreatedAt)
	_, err := k.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:           aws.String(k.table),
		Key:                 keyIDKey(info.KeyID),
		UpdateExpression:    aws.String("SET api_key_hash = :hash, created_at = :created, is_active = :active, gsi1pk = :pk, gsi1sk = :created, hardware_id = :hw, description = :desc"),
		ConditionExpression: aws.String("attribute_not_exists(key_id)"),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":hash":    &types.AttributeValueMemberS{Value: info.Hash},
			":created": &types.AttributeValueMemberS{Value: createdAt},
			":active":  &types.AttributeValueMemberBOOL{Value: info.Active},
			":pk":      &types.AttributeValueMemberS{Value: apiKeysPartition},
			":hw":      &types.AttributeValueMemberS{Value: info.HardwareID},
			":desc":    &types.AttributeValueMemberS{Value: cmp.Or(info.Description, "device key")},
		},
	})
	var ccf *types.ConditionalCheckFailedException
	if err != nil && !errors.As(err, &ccf) {
		return fmt.Errorf("writing device key %s: %w", info.KeyID, err)
	}
	return nil
}

// RevokeDeviceKey marks a device key inactive, on the condition that it
// is bound to its hardware_id: a gateway revokes the key of a device an
// operator reset, never a fleet key. A key not written yet (PutDeviceKey
// not done, or its answer lost) is written revoked, so that a late write
// of it does not bring it back.
func (k *Keys) RevokeDeviceKey(ctx context.Context, info KeyInfo) error {
	if info.HardwareID == "" {
		return fmt.Errorf("revoking device key %s: no hardware_id", info.KeyID)
	}
	createdAt := FormatTime(info.CreatedAt)
	_, err := k.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:           aws.String(k.table),
		Key:                 keyIDKey(info.KeyID),
		UpdateExpression:    aws.String("SET is_active = :inactive, hardware_id = :hw, api_key_hash = if_not_exists(api_key_hash, :hash), created_at = if_not_exists(created_at, :created), gsi1pk = :pk, gsi1sk = if_not_exists(gsi1sk, :created)"),
		ConditionExpression: aws.String("attribute_not_exists(key_id) OR hardware_id = :hw"),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":inactive": &types.AttributeValueMemberBOOL{Value: false},
			":hw":       &types.AttributeValueMemberS{Value: info.HardwareID},
			":hash":     &types.AttributeValueMemberS{Value: info.Hash},
			":created":  &types.AttributeValueMemberS{Value: createdAt},
			":pk":       &types.AttributeValueMemberS{Value: apiKeysPartition},
		},
	})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case errors.As(err, &ccf):
		return fmt.Errorf("revoking device key %s: it is not bound to %s", info.KeyID, info.HardwareID)
	case err != nil:
		return fmt.Errorf("revoking device key %s: %w", info.KeyID, err)
	}
	return nil
}

// Revoke marks the key inactive. Revoking a revoked key succeeds; an unknown keyID returns
// an error wrapping ErrKeyNotFound.
func (k *Keys) Revoke(ctx context.Context, keyID string) error {
	_, err := k.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(k.table),
		Key:                       keyIDKey(keyID),
		UpdateExpression:          aws.String("SET is_active = :inactive"),
		ConditionExpression:       aws.String("attribute_exists(key_id)"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":inactive": &types.AttributeValueMemberBOOL{Value: false}},
	})
	if err != nil {
		return fmt.Errorf("revoking api key %s: %w", keyID, notFound(err))
	}
	return nil
}

// TouchLastUsed sets the key's last_used_at to t (UTC, whole seconds). It writes on every
// call: throttling (the schema asks for at most one write per 5 minutes) is the caller's job.
// An unknown keyID returns an error wrapping ErrKeyNotFound.
func (k *Keys) TouchLastUsed(ctx context.Context, keyID string, t time.Time) error {
	_, err := k.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(k.table),
		Key:                       keyIDKey(keyID),
		UpdateExpression:          aws.String("SET last_used_at = :t"),
		ConditionExpression:       aws.String("attribute_exists(key_id)"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":t": &types.AttributeValueMemberS{Value: FormatTime(t)}},
	})
	if err != nil {
		return fmt.Errorf("recording use of api key %s: %w", keyID, notFound(err))
	}
	return nil
}

// Rehash replaces a key's stored hash, from oldHash to newHash, when the
// pepper is rotated: the gateway sees the raw key when a device
// authenticates and can compute its hash under the new pepper. The write
// is conditional on the old hash, so a concurrent rotation or revocation
// is not undone.
func (k *Keys) Rehash(ctx context.Context, keyID, oldHash, newHash string) error {
	_, err := k.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:           aws.String(k.table),
		Key:                 keyIDKey(keyID),
		UpdateExpression:    aws.String("SET api_key_hash = :new"),
		ConditionExpression: aws.String("api_key_hash = :old"),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":new": &types.AttributeValueMemberS{Value: newHash},
			":old": &types.AttributeValueMemberS{Value: oldHash},
		},
	})
	if err != nil {
		return fmt.Errorf("rehashing api key %s: %w", keyID, notFound(err))
	}
	return nil
}

// List returns all keys, active and revoked, newest first (by created_at, through gsi1).
func (k *Keys) List(ctx context.Context) ([]KeyInfo, error) {
	p := dynamodb.NewQueryPaginator(k.client, &dynamodb.QueryInput{
		TableName:                 aws.String(k.table),
		IndexName:                 aws.String(GSI1Index),
		KeyConditionExpression:    aws.String("gsi1pk = :pk"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: apiKeysPartition}},
		ScanIndexForward:          aws.Bool(false),
	})
	var out []KeyInfo
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("listing api keys in %s: %w", k.table, err)
		}
		for _, item := range page.Items {
			info, err := keyInfoFromItem(item)
			if err != nil {
				return nil, fmt.Errorf("listing api keys in %s: %w", k.table, err)
			}
			out = append(out, info)
		}
	}
	return out, nil
}

// Lookup finds the key whose hash matches rawKey, through api_key_hash_index. found is false
// when there is none; a revoked key is found with Active false. The index is eventually
// consistent: a key created a moment ago may not be found yet on AWS.
func (k *Keys) Lookup(ctx context.Context, rawKey string) (info KeyInfo, found bool, err error) {
	if rawKey == "" {
		return KeyInfo{}, false, nil
	}
	return k.LookupHash(ctx, HashKey(k.pepper, rawKey))
}

// LookupHash finds the key stored with hash (HashKey of some pepper and raw
// key), as Lookup does.
func (k *Keys) LookupHash(ctx context.Context, hash string) (info KeyInfo, found bool, err error) {
	out, err := k.client.Query(ctx, &dynamodb.QueryInput{
		TableName:                 aws.String(k.table),
		IndexName:                 aws.String(APIKeyHashIndex),
		KeyConditionExpression:    aws.String("api_key_hash = :h"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":h": &types.AttributeValueMemberS{Value: hash}},
	})
	if err != nil {
		return KeyInfo{}, false, fmt.Errorf("looking up api key in %s: %w", k.table, err)
	}
	for _, item := range out.Items {
		ki, err := keyInfoFromItem(item)
		if err != nil {
			return KeyInfo{}, false, fmt.Errorf("looking up api key in %s: %w", k.table, err)
		}
		// Two items with one hash would need a SHA-256 collision; prefer an active one anyway.
		if !found || (ki.Active && !info.Active) {
			info, found = ki, true
		}
	}
	return info, found, nil
}

func keyIDKey(keyID string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{attrKeyID: &types.AttributeValueMemberS{Value: keyID}}
}

// notFound maps a failed attribute_exists(key_id) condition to ErrKeyNotFound.
func notFound(err error) error {
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return ErrKeyNotFound
	}
	return err
}

func keyInfoFromItem(item map[string]types.AttributeValue) (KeyInfo, error) {
	var info KeyInfo
	var ok bool
	if info.KeyID, ok = stringAttr(item, attrKeyID); !ok {
		return KeyInfo{}, errors.New("item without key_id")
	}
	info.Hash, _ = stringAttr(item, attrKeyHash)
	info.Description, _ = stringAttr(item, attrDescription)
	info.HardwareID, _ = stringAttr(item, attrHardwareID)
	if b, ok := item[attrIsActive].(*types.AttributeValueMemberBOOL); ok {
		info.Active = b.Value
	}
	for _, f := range []struct {
		attr string
		dst  *time.Time
	}{{attrCreatedAt, &info.CreatedAt}, {attrLastUsedAt, &info.LastUsedAt}} {
		s, ok := stringAttr(item, f.attr)
		if !ok || s == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			return KeyInfo{}, fmt.Errorf("api key %s: %s: %w", info.KeyID, f.attr, err)
		}
		*f.dst = t.UTC()
	}
	return info, nil
}

func stringAttr(item map[string]types.AttributeValue, name string) (string, bool) {
	s, ok := item[name].(*types.AttributeValueMemberS)
	if !ok {
		return "", false
	}
	return s.Value, true
}

// LoadPepper returns the API key pepper: the contents of file when file is set (one trailing
// newline, \n or \r\n, removed), otherwise envValue (the GATEWAY_API_KEY_PEPPER variable).
// It is an error if both are empty or the file is empty.
func LoadPepper(envValue, file string) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("reading api key pepper file: %w", err)
		}
		p := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
		if p == "" {
			return "", fmt.Errorf("api key pepper file %s is empty", file)
		}
		return p, nil
	}
	if envValue == "" {
		return "", errors.New("no api key pepper: set GATEWAY_API_KEY_PEPPER or the pepper file option " +
			"(--api-key-pepper-file or GATEWAY_API_KEY_PEPPER_FILE)")
	}
	return envValue, nil
}
