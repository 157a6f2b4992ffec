package function

import (
	"cmp"
	"fmt"
	"strconv"
	"time"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/cloud"
)

// Config configures the function; ConfigFromEnv reads it from the
// environment of the Lambda.
type Config struct {
	// Tables are the four tables (TABLE_PREFIX).
	Tables cloud.Tables
	// Pepper hashes API keys (API_KEY_PEPPER; required).
	Pepper string
	// Endpoint overrides DynamoDB's endpoint, for local runs
	// (DYNAMODB_ENDPOINT).
	Endpoint string
	// MaxBodyBytes bounds a request body (MAX_BODY_BYTES); default 1 MiB,
	// as the gateway's http.max_body_bytes.
	MaxBodyBytes int64
	// Ordering is accept_older (default: older batches are stored and
	// counted) or reject_older (timestamp_conflict past OrderingGrace)
	// (ORDERING, ORDERING_GRACE; default 5m), as the gateway's
	// ingest.ordering.
	Ordering      string
	OrderingGrace time.Duration
	// ReadingsRetention sets the readings' TTL (READINGS_RETENTION;
	// default 2160h).
	ReadingsRetention time.Duration
	// TransactionMaxItems is the endpoint's TransactWriteItems action limit
	// (TRANSACTION_MAX_ITEMS, 2 to 100); 0 (unset) probes the endpoint
	// (cloud.ProbeTransactionLimit) when a batch first needs it: AWS takes
	// 100, DynamoDB Local's older releases 10.
	TransactionMaxItems int
	// WriteConcurrency bounds the BatchWriteItem requests in flight per
	// invocation (WRITE_CONCURRENCY; default 16).
	WriteConcurrency int
	// IdempotencyTTL is how long a request's answer is kept for replays of
	// its Idempotency-Key (IDEMPOTENCY_TTL; default 24h).
	IdempotencyTTL time.Duration
	// Limits are the contract's limits (MAX_READINGS_PER_BATCH).
	Limits contract.Limits
	// HTTPAlias, when set (HTTP_ALIAS; the template sets "api"), is the
	// only alias through which API Gateway events are served: API Gateway
	// invokes the function through it, and the gateways, allowed to
	// invoke the function itself, cannot forge an HTTP event carrying an
	// IAM authorizer context for the read routes. Unset (local runs under
	// the emulator), HTTP events are served however invoked.
	HTTPAlias string
}

// ConfigFromEnv reads the configuration through getenv (os.Getenv).
// Errors name the variable and the rule.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := Config{
		Tables:    cloud.TableNames(getenv("TABLE_PREFIX")),
		Pepper:    getenv("API_KEY_PEPPER"),
		Endpoint:  getenv("DYNAMODB_ENDPOINT"),
		HTTPAlias: getenv("HTTP_ALIAS"),
		Ordering:  cmp.Or(getenv("ORDERING"), "accept_older"),
		Limits:    contract.DefaultLimits(),
	}
	if c.Pepper == "" {
		return c, fmt.Errorf("API_KEY_PEPPER: must be set (the pepper of the api_keys hashes)")
	}
	if c.Ordering != "accept_older" && c.Ordering != "reject_older" {
		return c, fmt.Errorf("ORDERING: %q is not one of accept_older, reject_older", c.Ordering)
	}
	var err error
	if c.MaxBodyBytes, err = positiveInt(getenv, "MAX_BODY_BYTES", 1<<20); err != nil {
		return c, err
	}
	for _, v := range []struct {
		name string
		dst  *int
		def  int
	}{{"TRANSACTION_MAX_ITEMS", &c.TransactionMaxItems, 0}, {"WRITE_CONCURRENCY", &c.WriteConcurrency, 16},
		{"MAX_READINGS_PER_BATCH", &c.Limits.MaxReadings, c.Limits.MaxReadings}} {
		n, err := positiveInt(getenv, v.name, int64(v.def))
		if err != nil {
			return c, err
		}
		*v.dst = int(n)
	}
	for _, v := range []struct {
		name string
		dst  *time.Duration
		def  time.Duration
	}{{"ORDERING_GRACE", &c.OrderingGrace, 5 * time.Minute}, {"READINGS_RETENTION", &c.ReadingsRetention, 90 * 24 * time.Hour},
		{"IDEMPOTENCY_TTL", &c.IdempotencyTTL, 24 * time.Hour}} {
		if *v.dst, err = duration(getenv, v.name, v.def); err != nil {
			return c, err
		}
	}
	if c.TransactionMaxItems != 0 && (c.TransactionMaxItems < 2 || c.TransactionMaxItems > 100) {
		return c, fmt.Errorf("TRANSACTION_MAX_ITEMS: %d must be between 2 and 100 (unset: probed)", c.TransactionMaxItems)
	}
	return c, nil
}

func positiveInt(getenv func(string) string, name string, def int64) (int64, error) {
	s := getenv(name)
	if s == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s: %q must be a positive integer", name, s)
	}
	return n, nil
}

func duration(getenv func(string) string, name string, def time.Duration) (time.Duration, error) {
	s := getenv(name)
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%s: %q must be a duration such as 5m or 24h, not negative", name, s)
	}
	return d, nil
}
