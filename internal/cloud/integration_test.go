package cloud_test

import (
	"context"
	"log/slog"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/internal/cloud"
)

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// schema is a table's description reduced to what the locked schema fixes.
type schema struct {
	keys    []string          // "name HASH|RANGE"
	attrs   map[string]string // attribute definitions: name -> type
	indexes map[string][]string
	billing types.BillingMode
}

func describe(t *testing.T, client *dynamodb.Client, table string) schema {
	t.Helper()
	out, err := client.DescribeTable(testContext(t), &dynamodb.DescribeTableInput{TableName: aws.String(table)})
	require.NoError(t, err)
	d := out.Table
	require.Equal(t, types.TableStatusActive, d.TableStatus)
	s := schema{keys: keyList(d.KeySchema), attrs: map[string]string{}, indexes: map[string][]string{}}
	for _, a := range d.AttributeDefinitions {
		s.attrs[aws.ToString(a.AttributeName)] = string(a.AttributeType)
	}
	for _, g := range d.GlobalSecondaryIndexes {
		require.Equal(t, types.ProjectionTypeAll, g.Projection.ProjectionType, "index %s", aws.ToString(g.IndexName))
		s.indexes[aws.ToString(g.IndexName)] = keyList(g.KeySchema)
	}
	require.Empty(t, d.LocalSecondaryIndexes)
	if d.BillingModeSummary != nil {
		s.billing = d.BillingModeSummary.BillingMode
	}
	return s
}

func keyList(ks []types.KeySchemaElement) []string {
	var out []string
	for _, k := range ks {
		out = append(out, aws.ToString(k.AttributeName)+" "+string(k.KeyType))
	}
	return out
}

func TestCreateTables(t *testing.T) {
	t.Parallel()
	db := dynamotest.Shared(t)
	client := db.Client(t)
	tables := db.NewTables(t) // first CreateTables

	// Second run: every table exists already, TTL is on already.
	require.NoError(t, cloud.CreateTables(testContext(t), client, tables, slog.New(slog.NewTextHandler(t.Output(), nil))))

	tests := []struct {
		table string
		want  schema
	}{
		{table: tables.Devices, want: schema{
			keys:    []string{"hardware_id HASH"},
			attrs:   map[string]string{"hardware_id": "S", "gsi1pk": "S", "gsi1sk": "S"},
			indexes: map[string][]string{"gsi1": {"gsi1pk HASH", "gsi1sk RANGE"}},
			billing: types.BillingModePayPerRequest,
		}},
		{table: tables.Readings, want: schema{
			keys:    []string{"hardware_id HASH", "ts_batch RANGE"},
			attrs:   map[string]string{"hardware_id": "S", "ts_batch": "S"},
			indexes: map[string][]string{},
			billing: types.BillingModePayPerRequest,
		}},
		{table: tables.ProcessedBatches, want: schema{
			keys:    []string{"batch_id HASH"},
			attrs:   map[string]string{"batch_id": "S"},
			indexes: map[string][]string{},
			billing: types.BillingModePayPerRequest,
		}},
		{table: tables.APIKeys, want: schema{
			keys:  []string{"key_id HASH"},
			attrs: map[string]string{"key_id": "S", "api_key_hash": "S", "gsi1pk": "S", "gsi1sk": "S"},
			indexes: map[string][]string{
				"api_key_hash_index": {"api_key_hash HASH"},
				"gsi1":               {"gsi1pk HASH", "gsi1sk RANGE"},
			},
			billing: types.BillingModePayPerRequest,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.table, func(t *testing.T) {
			require.Equal(t, tt.want, describe(t, client, tt.table))
		})
	}
}

func TestCreateTablesTTL(t *testing.T) {
	t.Parallel()
	db := dynamotest.Shared(t)
	client := db.Client(t)
	tables := db.NewTables(t)

	tests := []struct {
		table      string
		wantStatus types.TimeToLiveStatus
		wantAttr   string
	}{
		{table: tables.Readings, wantStatus: types.TimeToLiveStatusEnabled, wantAttr: "expiration_time"},
		{table: tables.ProcessedBatches, wantStatus: types.TimeToLiveStatusEnabled, wantAttr: "expiration_time"},
		{table: tables.Devices, wantStatus: types.TimeToLiveStatusDisabled},
		{table: tables.APIKeys, wantStatus: types.TimeToLiveStatusDisabled},
	}
	for _, tt := range tests {
		t.Run(tt.table, func(t *testing.T) {
			out, err := client.DescribeTimeToLive(testContext(t), &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(tt.table)})
			require.NoError(t, err)
			require.Equal(t, tt.wantStatus, out.TimeToLiveDescription.TimeToLiveStatus)
			require.Equal(t, tt.wantAttr, aws.ToString(out.TimeToLiveDescription.AttributeName))
		})
	}
}

func TestCreateTablesRejectsForeignSchema(t *testing.T) {
	t.Parallel()
	db := dynamotest.Shared(t)
	client := db.Client(t)
	ctx := testContext(t)
	tables := cloud.TableNames("foreign_" + uuid.NewString()[:8] + "_")
	_, err := client.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(tables.ProcessedBatches),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("id"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("id"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, name := range tables.All() {
			_, _ = client.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(name)})
		}
	})

	err = cloud.CreateTables(ctx, client, tables, nil)
	require.ErrorContains(t, err, tables.ProcessedBatches+": key schema is (id HASH), want (batch_id HASH)")
}

var (
	rawKeyPattern  = regexp.MustCompile(`^[0-9a-f]{64}$`)
	timestampRegex = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$`)
)

func TestKeysLifecycle(t *testing.T) {
	t.Parallel()
	db := dynamotest.Shared(t)
	client := db.Client(t)
	tables := db.NewTables(t)
	ctx := testContext(t)
	keys := cloud.NewKeys(client, tables.APIKeys, "pepper")

	before := time.Now().UTC().Truncate(time.Second)
	raw, info, err := keys.Create(ctx, "greenhouse A")
	require.NoError(t, err)
	require.Regexp(t, rawKeyPattern, raw)
	id, err := uuid.Parse(info.KeyID)
	require.NoError(t, err)
	require.Equal(t, uuid.Version(4), id.Version())
	require.Equal(t, uuid.RFC4122, id.Variant())
	require.Equal(t, cloud.HashKey("pepper", raw), info.Hash)
	require.True(t, info.Active)
	require.Equal(t, "greenhouse A", info.Description)
	require.WithinRange(t, info.CreatedAt, before, time.Now().UTC())
	require.True(t, info.LastUsedAt.IsZero())

	// The stored item has exactly the schema's attributes.
	item, err := client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(tables.APIKeys),
		Key:            map[string]types.AttributeValue{"key_id": &types.AttributeValueMemberS{Value: info.KeyID}},
		ConsistentRead: aws.Bool(true),
	})
	require.NoError(t, err)
	createdAt := item.Item["created_at"].(*types.AttributeValueMemberS).Value
	require.Regexp(t, timestampRegex, createdAt)
	require.Equal(t, map[string]types.AttributeValue{
		"key_id":       &types.AttributeValueMemberS{Value: info.KeyID},
		"api_key_hash": &types.AttributeValueMemberS{Value: info.Hash},
		"created_at":   &types.AttributeValueMemberS{Value: createdAt},
		"is_active":    &types.AttributeValueMemberBOOL{Value: true},
		"description":  &types.AttributeValueMemberS{Value: "greenhouse A"},
		"gsi1pk":       &types.AttributeValueMemberS{Value: "api_keys"},
		"gsi1sk":       &types.AttributeValueMemberS{Value: createdAt},
	}, item.Item)

	got, found, err := keys.Lookup(ctx, raw)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, info, got)

	_, found, err = cloud.NewKeys(client, tables.APIKeys, "other pepper").Lookup(ctx, raw)
	require.NoError(t, err)
	require.False(t, found, "a different pepper must not match")
	_, found, err = keys.Lookup(ctx, raw[:63]+"x")
	require.NoError(t, err)
	require.False(t, found)
	_, found, err = keys.Lookup(ctx, "")
	require.NoError(t, err)
	require.False(t, found)

	used := time.Date(2024, 1, 15, 14, 22, 0, 500_000_000, time.UTC)
	require.NoError(t, keys.TouchLastUsed(ctx, info.KeyID, used))
	got, found, err = keys.Lookup(ctx, raw)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, used.Truncate(time.Second), got.LastUsedAt)

	require.NoError(t, keys.Revoke(ctx, info.KeyID))
	got, found, err = keys.Lookup(ctx, raw)
	require.NoError(t, err)
	require.True(t, found, "a revoked key is still found")
	require.False(t, got.Active)
	require.NoError(t, keys.Revoke(ctx, info.KeyID), "revoking twice is fine")
}

func TestKeysUnknownID(t *testing.T) {
	t.Parallel()
	db := dynamotest.Shared(t)
	tables := db.NewTables(t)
	keys := cloud.NewKeys(db.Client(t), tables.APIKeys, "pepper")
	ctx := testContext(t)
	unknown := uuid.NewString()

	tests := []struct {
		name string
		call func() error
	}{
		{name: "revoke", call: func() error { return keys.Revoke(ctx, unknown) }},
		{name: "touch", call: func() error { return keys.TouchLastUsed(ctx, unknown, time.Now()) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			require.ErrorIs(t, err, cloud.ErrKeyNotFound)
			require.ErrorContains(t, err, unknown)
		})
	}
	list, err := keys.List(ctx)
	require.NoError(t, err)
	require.Empty(t, list, "nothing was created by the failed calls")
}

func TestKeysListNewestFirst(t *testing.T) {
	t.Parallel()
	db := dynamotest.Shared(t)
	tables := db.NewTables(t)
	keys := cloud.NewKeys(db.Client(t), tables.APIKeys, "pepper")
	ctx := testContext(t)

	list, err := keys.List(ctx)
	require.NoError(t, err)
	require.Empty(t, list)

	base := time.Date(2024, 1, 10, 8, 0, 0, 0, time.UTC)
	var created []cloud.KeyInfo
	for i, desc := range []string{"first", "", "third"} {
		cloud.SetClock(keys, func() time.Time { return base.Add(time.Duration(i) * time.Hour) })
		_, info, err := keys.Create(ctx, desc)
		require.NoError(t, err)
		created = append(created, info)
	}
	require.NoError(t, keys.Revoke(ctx, created[0].KeyID))
	created[0].Active = false

	list, err = keys.List(ctx)
	require.NoError(t, err)
	slices.Reverse(created)
	require.Equal(t, created, list)
	require.Equal(t, "2024-01-10T10:00:00Z", cloud.FormatTime(list[0].CreatedAt))
}

func TestProbeTransactionLimit(t *testing.T) {
	t.Parallel()
	db := dynamotest.Shared(t)
	client := db.Client(t)
	tables := db.NewTables(t)
	ctx := testContext(t)

	// DynamoDB Local 1.11.478 accepts at most 10 actions per transaction (AWS: 100).
	n, err := cloud.ProbeTransactionLimit(ctx, client, tables.ProcessedBatches)
	require.NoError(t, err)
	require.Equal(t, 10, n)

	out, err := client.Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(tables.ProcessedBatches), ConsistentRead: aws.Bool(true)})
	require.NoError(t, err)
	require.Zero(t, out.Count, "the probe must not write")

	_, err = cloud.ProbeTransactionLimit(ctx, client, "no_such_table")
	var notFound *types.ResourceNotFoundException
	require.ErrorAs(t, err, &notFound, "other errors are returned, not taken as a limit")
}

func TestDeviceKeys(t *testing.T) {
	t.Parallel()
	db := dynamotest.Shared(t)
	client := db.Client(t)
	tables := db.NewTables(t)
	ctx := testContext(t)
	keys := cloud.NewKeys(client, tables.APIKeys, "pepper")
	const hw, other = "AA:BB:CC:DD:EE:01", "AA:BB:CC:DD:EE:02"

	// An operator's bound key carries the binding, and the lookup returns it.
	raw, info, err := keys.CreateBound(ctx, "sensor 1", hw)
	require.NoError(t, err)
	got, found, err := keys.Lookup(ctx, raw)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, hw, got.HardwareID)
	require.Equal(t, info, got)

	// A key minted by a gateway is written later, and writing it again
	// (a replay after a lost answer) is harmless.
	minted, mintedInfo, err := cloud.NewKey("pepper", time.Now())
	require.NoError(t, err)
	mintedInfo.HardwareID, mintedInfo.Description = other, "enrolled"
	_, found, err = keys.Lookup(ctx, minted)
	require.NoError(t, err)
	require.False(t, found, "NewKey stores nothing")
	require.NoError(t, keys.PutDeviceKey(ctx, mintedInfo))
	require.NoError(t, keys.PutDeviceKey(ctx, mintedInfo), "a replay counts as written")
	got, found, err = keys.Lookup(ctx, minted)
	require.NoError(t, err)
	require.True(t, found)
	require.True(t, got.Active)
	require.Equal(t, other, got.HardwareID)

	// A gateway revokes only a key bound to the device it names.
	other2 := mintedInfo
	other2.HardwareID = hw
	require.ErrorContains(t, keys.RevokeDeviceKey(ctx, other2), "not bound to "+hw)
	_, fleetInfo, err := keys.Create(ctx, "fleet")
	require.NoError(t, err)
	fleetInfo.HardwareID = other
	require.ErrorContains(t, keys.RevokeDeviceKey(ctx, fleetInfo), "not bound to "+other)
	require.NoError(t, keys.RevokeDeviceKey(ctx, mintedInfo))
	got, found, err = keys.Lookup(ctx, minted)
	require.NoError(t, err)
	require.True(t, found)
	require.False(t, got.Active)
	require.NoError(t, keys.PutDeviceKey(ctx, mintedInfo), "a late write")
	got, _, err = keys.Lookup(ctx, minted)
	require.NoError(t, err)
	require.False(t, got.Active, "a late write does not bring a revoked key back")

	// A key revoked before it was ever written is written revoked, and
	// stays so.
	late, lateInfo, err := cloud.NewKey("pepper", time.Now())
	require.NoError(t, err)
	lateInfo.HardwareID = other
	require.NoError(t, keys.RevokeDeviceKey(ctx, lateInfo))
	require.NoError(t, keys.PutDeviceKey(ctx, lateInfo))
	got, found, err = keys.Lookup(ctx, late)
	require.NoError(t, err)
	require.True(t, found)
	require.False(t, got.Active)
	require.Equal(t, other, got.HardwareID)

	list, err := keys.List(ctx)
	require.NoError(t, err)
	bindings := map[string]string{}
	for _, k := range list {
		bindings[k.KeyID] = k.HardwareID
	}
	require.Equal(t, map[string]string{info.KeyID: hw, mintedInfo.KeyID: other, fleetInfo.KeyID: "",
		lateInfo.KeyID: other}, bindings)
}
