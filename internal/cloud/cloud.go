// Package cloud is the gateway's view of the cloud DynamoDB tables: their names and locked
// definitions (schema 1.0.0: devices, device_readings, processed_batches, api_keys), a client
// constructor that also works against DynamoDB Local, idempotent table creation, API key
// management, and a probe for the endpoint's transaction size limit.
//
// The table layout is fixed by the locked schema; this package adds nothing to it. Metadata
// timestamps are RFC 3339 strings in UTC with second precision (2024-01-15T10:30:00Z), TTL
// attributes are epoch seconds.
package cloud

import (
	"fmt"
	"net/url"
	"regexp"
)

// Base table names of the locked schema, before the prefix.
const (
	DevicesTable          = "devices"
	ReadingsTable         = "device_readings"
	ProcessedBatchesTable = "processed_batches"
	APIKeysTable          = "api_keys"
)

// Index and attribute names of the locked schema that callers need.
const (
	// GSI1Index is the listing index of the devices and api_keys tables (gsi1pk, gsi1sk).
	GSI1Index = "gsi1"
	// APIKeyHashIndex is the api_keys index keyed by api_key_hash.
	APIKeyHashIndex = "api_key_hash_index"
	// TTLAttribute is the TTL attribute (epoch seconds) of device_readings and processed_batches.
	TTLAttribute = "expiration_time"
)

// Config says where the cloud tables are. Credentials are not part of it: they come from
// the AWS SDK's default chain (environment, shared files, IMDS, ...).
type Config struct {
	// Endpoint overrides the DynamoDB endpoint URL, e.g. http://127.0.0.1:8000 for DynamoDB
	// Local. Empty means the regional AWS endpoint.
	Endpoint string `yaml:"endpoint"`
	// Region is the AWS region. Empty means the SDK's chain (AWS_REGION, shared config);
	// with an Endpoint set and no region found anywhere, us-east-1 is used.
	Region string `yaml:"region"`
	// TablePrefix is prepended verbatim to every table name ("prod_" gives "prod_devices").
	// Empty means no prefix.
	TablePrefix string `yaml:"table_prefix"`
}

var (
	tableNameChars = regexp.MustCompile(`^[A-Za-z0-9_.-]*$`)
	regionChars    = regexp.MustCompile(`^[A-Za-z0-9-]*$`)
)

// maxTableName is DynamoDB's limit on table name length.
const maxTableName = 255

// FieldError is a Config field that breaks a rule. Field is the yaml name
// (endpoint, region, table_prefix); programs that spell the setting
// differently (gatewayd's dynamodb_endpoint, a command-line flag) rename it
// before showing the error.
type FieldError struct {
	Field string
	Value string
	Rule  string
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s %q: %s", e.Field, e.Value, e.Rule) }

// Validate reports whether the configuration is usable; its errors are
// *FieldError.
func (c Config) Validate() error {
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return &FieldError{Field: "endpoint", Value: c.Endpoint, Rule: "want an absolute http or https URL"}
		}
	}
	if !regionChars.MatchString(c.Region) {
		return &FieldError{Field: "region", Value: c.Region, Rule: "only letters, digits and '-' are allowed"}
	}
	if !tableNameChars.MatchString(c.TablePrefix) {
		return &FieldError{Field: "table_prefix", Value: c.TablePrefix, Rule: "only a-z, A-Z, 0-9, '_', '-' and '.' are allowed"}
	}
	if n := len(c.TablePrefix) + len(ProcessedBatchesTable); n > maxTableName {
		return &FieldError{Field: "table_prefix", Value: c.TablePrefix,
			Rule: fmt.Sprintf("table names would be %d characters, DynamoDB allows %d", n, maxTableName)}
	}
	return nil
}

// Tables holds the full names of the four tables.
type Tables struct {
	Devices          string
	Readings         string
	ProcessedBatches string
	APIKeys          string
}

// TableNames returns the table names with prefix prepended verbatim.
func TableNames(prefix string) Tables {
	return Tables{
		Devices:          prefix + DevicesTable,
		Readings:         prefix + ReadingsTable,
		ProcessedBatches: prefix + ProcessedBatchesTable,
		APIKeys:          prefix + APIKeysTable,
	}
}

// All returns the four names in creation order: devices, device_readings,
// processed_batches, api_keys.
func (t Tables) All() []string {
	return []string{t.Devices, t.Readings, t.ProcessedBatches, t.APIKeys}
}
