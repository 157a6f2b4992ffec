package cloud

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

// tableActiveTimeout bounds the wait for one table to become ACTIVE.
const tableActiveTimeout = 5 * time.Minute

// TableDefinitions returns the CreateTable requests of the locked schema for the names in t,
// in the order devices, device_readings, processed_batches, api_keys. All tables are
// on-demand (PAY_PER_REQUEST) and every index projects ALL attributes. Each call returns new
// values, so callers may modify them.
func TableDefinitions(t Tables) []*dynamodb.CreateTableInput {
	return []*dynamodb.CreateTableInput{
		{
			TableName:            aws.String(t.Devices),
			AttributeDefinitions: attrs("hardware_id", "gsi1pk", "gsi1sk"),
			KeySchema:            keys("hardware_id", ""),
			GlobalSecondaryIndexes: []types.GlobalSecondaryIndex{
				gsi(GSI1Index, "gsi1pk", "gsi1sk"),
			},
			BillingMode: types.BillingModePayPerRequest,
		},
		{
			TableName:            aws.String(t.Readings),
			AttributeDefinitions: attrs("hardware_id", "ts_batch"),
			KeySchema:            keys("hardware_id", "ts_batch"),
			BillingMode:          types.BillingModePayPerRequest,
		},
		{
			TableName:            aws.String(t.ProcessedBatches),
			AttributeDefinitions: attrs("batch_id"),
			KeySchema:            keys("batch_id", ""),
			BillingMode:          types.BillingModePayPerRequest,
		},
		{
			TableName:            aws.String(t.APIKeys),
			AttributeDefinitions: attrs("key_id", "api_key_hash", "gsi1pk", "gsi1sk"),
			KeySchema:            keys("key_id", ""),
			GlobalSecondaryIndexes: []types.GlobalSecondaryIndex{
				gsi(APIKeyHashIndex, "api_key_hash", ""),
				gsi(GSI1Index, "gsi1pk", "gsi1sk"),
			},
			BillingMode: types.BillingModePayPerRequest,
		},
	}
}

// TTLAttributes returns, for each table with a TTL in the locked schema, the name of its
// TTL attribute: expiration_time on device_readings and processed_batches.
func TTLAttributes(t Tables) map[string]string {
	return map[string]string{
		t.Readings:         TTLAttribute,
		t.ProcessedBatches: TTLAttribute,
	}
}

func attrs(names ...string) []types.AttributeDefinition {
	defs := make([]types.AttributeDefinition, 0, len(names))
	for _, n := range names {
		defs = append(defs, types.AttributeDefinition{
			AttributeName: aws.String(n),
			AttributeType: types.ScalarAttributeTypeS,
		})
	}
	return defs
}

func keys(hash, rangeKey string) []types.KeySchemaElement {
	ks := []types.KeySchemaElement{{AttributeName: aws.String(hash), KeyType: types.KeyTypeHash}}
	if rangeKey != "" {
		ks = append(ks, types.KeySchemaElement{AttributeName: aws.String(rangeKey), KeyType: types.KeyTypeRange})
	}
	return ks
}

func gsi(name, hash, rangeKey string) types.GlobalSecondaryIndex {
	return types.GlobalSecondaryIndex{
		IndexName:  aws.String(name),
		KeySchema:  keys(hash, rangeKey),
		Projection: &types.Projection{ProjectionType: types.ProjectionTypeAll},
	}
}

// CreateTables creates the four tables of t with TableDefinitions, waits until each is
// ACTIVE and enables TTL where TTLAttributes says so. It is idempotent: a table that already
// exists is accepted if its key schema and required indexes match the locked schema (extra
// indexes are allowed), otherwise CreateTables returns an error; TTL already enabled on the
// right attribute is accepted. A nil logger discards the log.
func CreateTables(ctx context.Context, client *dynamodb.Client, t Tables, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	defs := TableDefinitions(t)
	for _, def := range defs {
		name := aws.ToString(def.TableName)
		_, err := client.CreateTable(ctx, def)
		var inUse *types.ResourceInUseException
		switch {
		case err == nil:
			logger.Info("created table", "table", name)
		case errors.As(err, &inUse):
			logger.Info("table exists", "table", name)
		default:
			return fmt.Errorf("creating table %s: %w", name, err)
		}
	}

	waiter := dynamodb.NewTableExistsWaiter(client, func(o *dynamodb.TableExistsWaiterOptions) {
		o.MinDelay = time.Second
		o.MaxDelay = 10 * time.Second
	})
	for _, def := range defs {
		name := aws.ToString(def.TableName)
		out, err := waiter.WaitForOutput(ctx, &dynamodb.DescribeTableInput{TableName: def.TableName}, tableActiveTimeout)
		if err != nil {
			return fmt.Errorf("waiting for table %s to become active: %w", name, err)
		}
		if err := checkSchema(def, out.Table); err != nil {
			return fmt.Errorf("table %s: %w", name, err)
		}
	}

	ttl := TTLAttributes(t)
	for _, def := range defs {
		name := aws.ToString(def.TableName)
		attr, ok := ttl[name]
		if !ok {
			continue
		}
		if err := enableTTL(ctx, client, name, attr, logger); err != nil {
			return err
		}
	}
	return nil
}

// enableTTL turns on TTL for table on attr unless it already is.
func enableTTL(ctx context.Context, client *dynamodb.Client, table, attr string, logger *slog.Logger) error {
	desc, err := client.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(table)})
	if err != nil {
		return fmt.Errorf("describing ttl of table %s: %w", table, err)
	}
	if d := desc.TimeToLiveDescription; d != nil {
		current := aws.ToString(d.AttributeName)
		switch d.TimeToLiveStatus {
		case types.TimeToLiveStatusEnabled, types.TimeToLiveStatusEnabling:
			if current != attr {
				return fmt.Errorf("table %s has ttl on attribute %s, want %s", table, current, attr)
			}
			logger.Info("ttl already enabled", "table", table, "attribute", attr)
			return nil
		}
	}
	_, err = client.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName: aws.String(table),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{
			AttributeName: aws.String(attr),
			Enabled:       aws.Bool(true),
		},
	})
	if err != nil {
		// A concurrent CreateTables may have enabled it between describe and update; both
		// AWS and DynamoDB Local answer "TimeToLive is already enabled" then.
		var apiErr smithy.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode() == "ValidationException" &&
			strings.Contains(strings.ToLower(apiErr.ErrorMessage()), "already enabled") {
			logger.Info("ttl already enabled", "table", table, "attribute", attr)
			return nil
		}
		return fmt.Errorf("enabling ttl on table %s: %w", table, err)
	}
	logger.Info("enabled ttl", "table", table, "attribute", attr)
	return nil
}

// checkSchema compares an existing table with its definition: same key schema, and every
// defined index present with the same key schema.
func checkSchema(def *dynamodb.CreateTableInput, have *types.TableDescription) error {
	if have == nil {
		return errors.New("no table description")
	}
	if want, got := keyString(def.KeySchema), keyString(have.KeySchema); want != got {
		return fmt.Errorf("key schema is %s, want %s", got, want)
	}
	for _, wantIdx := range def.GlobalSecondaryIndexes {
		name := aws.ToString(wantIdx.IndexName)
		i := slices.IndexFunc(have.GlobalSecondaryIndexes, func(g types.GlobalSecondaryIndexDescription) bool {
			return aws.ToString(g.IndexName) == name
		})
		if i < 0 {
			return fmt.Errorf("index %s is missing", name)
		}
		if want, got := keyString(wantIdx.KeySchema), keyString(have.GlobalSecondaryIndexes[i].KeySchema); want != got {
			return fmt.Errorf("index %s key schema is %s, want %s", name, got, want)
		}
	}
	return nil
}

func keyString(ks []types.KeySchemaElement) string {
	parts := make([]string, 0, len(ks))
	for _, k := range ks {
		parts = append(parts, aws.ToString(k.AttributeName)+" "+string(k.KeyType))
	}
	return "(" + strings.Join(parts, ", ") + ")"
}
