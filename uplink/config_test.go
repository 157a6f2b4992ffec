package uplink_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/uplink"
)

// Every invalid setting is named in the error, as the operator wrote it.
func TestConfigErrorsNameTheSetting(t *testing.T) {
	require.NoError(t, uplink.Config{}.Validate())
	tests := []struct {
		name string
		cfg  uplink.Config
		want string
	}{
		{"request timeout", uplink.Config{RequestTimeout: -time.Second}, "uplink.request_timeout: must not be negative"},
		{"min backoff", uplink.Config{MinBackoff: -time.Second}, "uplink.min_backoff: must not be negative"},
		{"max backoff", uplink.Config{MaxBackoff: -time.Second}, "uplink.max_backoff: must not be negative"},
		{"poll interval", uplink.Config{PollInterval: -time.Second}, "uplink.poll_interval: must not be negative"},
		{"backoffs crossed", uplink.Config{MinBackoff: time.Minute, MaxBackoff: time.Second}, "uplink.min_backoff: must not exceed uplink.max_backoff"},
		{"retention", uplink.Config{ReadingsRetention: -time.Hour}, "uplink.readings_retention: must not be negative"},
		{"max wait", uplink.Config{MaxWait: -time.Millisecond}, "uplink.max_wait: must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.EqualError(t, tt.cfg.Validate(), tt.want)
		})
	}
}

// A dependency the configured target needs and does not have is New's
// error, before anything runs.
func TestNewNamesAMissingDependency(t *testing.T) {
	buf := openBuffer(t)
	db := &fakeDB{}
	lambda := uplink.Config{Target: uplink.TargetLambda, Lambda: uplink.LambdaConfig{Function: "f"}}
	tests := []struct {
		name string
		cfg  uplink.Config
		deps uplink.Deps
		want string
	}{
		{"store", uplink.Config{}, uplink.Deps{DynamoDB: db}, "uplink: a store is required"},
		{"dynamodb client", uplink.Config{}, uplink.Deps{Store: buf}, "uplink: a DynamoDB client is required"},
		{"prober", uplink.Config{WriteMode: "transaction"}, uplink.Deps{Store: buf, DynamoDB: db}, "uplink.transaction_max_items: 0 (probe) needs a prober"},
		{"key writer", uplink.Config{}, uplink.Deps{Store: buf, DynamoDB: db, Keys: &fakeKeys{}}, "uplink: device keys need a key writer"},
		{"lambda client", lambda, uplink.Deps{Store: buf}, "uplink.target: lambda needs a Lambda client"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := uplink.New(tt.cfg, tt.deps)
			require.EqualError(t, err, tt.want)
		})
	}
	_, err := uplink.New(uplink.Config{WriteMode: "transaction", TransactionMaxItems: 10}, uplink.Deps{Store: buf, DynamoDB: db})
	require.NoError(t, err, "a configured limit needs no prober")
}
