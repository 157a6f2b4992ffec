package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestUplinkAdaptiveSettingsFromFileAndEnvironment(t *testing.T) {
	file := writeFile(t, `
uplink:
  max_concurrency: 32
  fresh_reserve: 16
  max_wait: 250ms
  wait_target_rate: 50
`)
	env := []string{"GATEWAY_UPLINK_MAX_BATCH_SIZE=64", "GATEWAY_UPLINK_WAIT_STEEPNESS=0.5",
		"GATEWAY_UPLINK_MAX_WAIT=300ms", "GATEWAY_API_KEY_PEPPER=x"}
	cfg, _, unknown, err := loadConfig([]string{"--config", file}, env)
	require.NoError(t, err)
	require.Empty(t, unknown)
	u := cfg.Uplink
	require.Equal(t, 32, u.MaxConcurrency)
	require.Equal(t, 16, u.FreshReserve)
	require.Equal(t, 300*time.Millisecond, u.MaxWait, "environment beats file")
	require.Equal(t, 50.0, u.WaitTargetRate)
	require.Equal(t, 64, u.MaxBatchSize)
	require.Equal(t, 0.5, u.WaitSteepness)
}

func TestUplinkAdaptiveSettingsErrorsNameTheSetting(t *testing.T) {
	tests := []struct {
		name string
		file string
		env  []string
		want string
	}{
		{"max_concurrency too high", "uplink:\n  max_concurrency: 1000\n", nil, "uplink.max_concurrency: must be between 1 and 256"},
		{"concurrency above max_concurrency", "uplink:\n  concurrency: 40\n  max_concurrency: 20\n", nil, "uplink.concurrency: must not exceed uplink.max_concurrency"},
		{"fresh_reserve not below lease_batches", "uplink:\n  lease_batches: 32\n  fresh_reserve: 32\n", nil, "uplink.fresh_reserve: 32 must be below uplink.lease_batches (32)"},
		{"negative max_wait", "", []string{"GATEWAY_UPLINK_MAX_WAIT=-1s"}, "uplink.max_wait: must not be negative"},
		{"max_batch_size above lease_batches", "uplink:\n  max_batch_size: 2000\n", nil, "uplink.max_batch_size: 2000 must not exceed uplink.lease_batches (1024)"},
		{"negative wait_target_rate", "uplink:\n  wait_target_rate: -1\n", nil, "uplink.wait_target_rate"},
		{"wait_steepness not a number", "", []string{"GATEWAY_UPLINK_WAIT_STEEPNESS=steep"}, "GATEWAY_UPLINK_WAIT_STEEPNESS (uplink.wait_steepness)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, _, err := loadConfig([]string{"--config", writeFile(t, tt.file)}, append(tt.env, "GATEWAY_API_KEY_PEPPER=x"))
			require.ErrorContains(t, err, tt.want)
		})
	}
}

func TestUplinkLambdaSettingsFromFileEnvironmentAndFlags(t *testing.T) {
	file := writeFile(t, "uplink:\n  target: lambda\n  lambda:\n    function: from-file\n    max_items: 80\n")
	env := []string{"GATEWAY_UPLINK_LAMBDA_MAX_WAIT=30ms", "GATEWAY_UPLINK_LAMBDA_FUNCTION=from-env", "GATEWAY_API_KEY_PEPPER=x"}
	cfg, _, unknown, err := loadConfig([]string{"--config", file, "--lambda-function", "arn:aws:lambda:eu-west-1:123456789012:function:readings",
		"--lambda-endpoint", "http://127.0.0.1:9001"}, env)
	require.NoError(t, err)
	require.Empty(t, unknown)
	u := cfg.Uplink
	require.Equal(t, "lambda", u.Target)
	require.Equal(t, "arn:aws:lambda:eu-west-1:123456789012:function:readings", u.Lambda.Function, "a flag beats environment and file")
	require.Equal(t, "http://127.0.0.1:9001", u.Lambda.Endpoint)
	require.Equal(t, 80, u.Lambda.MaxItems)
	require.Equal(t, 30*time.Millisecond, u.Lambda.MaxWait)

	cfg, _, _, err = loadConfig([]string{"--uplink-target", "lambda", "--lambda-function", "function"}, []string{"GATEWAY_API_KEY_PEPPER=x"})
	require.NoError(t, err)
	require.Equal(t, "lambda", cfg.Uplink.Target)
	require.Equal(t, 5<<20, cfg.Uplink.Lambda.MaxBytes, "the default stays under Lambda's 6 MB payload")
	require.Equal(t, "zstd", cfg.Uplink.Lambda.Encoding, "events travel compressed by default")
}

func TestUplinkLambdaSettingsErrorsNameTheSetting(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"unknown target", []string{"--uplink-target", "sqs"}, nil, `uplink.target: "sqs" is not one of dynamodb, lambda`},
		{"lambda without a function", []string{"--uplink-target", "lambda"}, nil, "uplink.lambda.function: must be set when uplink.target is lambda"},
		{"endpoint not a URL", []string{"--uplink-target", "lambda", "--lambda-function", "f", "--lambda-endpoint", "127.0.0.1:9001"}, nil, "uplink.lambda.endpoint:"},
		{"max_bytes over the payload limit", nil, []string{"GATEWAY_UPLINK_LAMBDA_MAX_BYTES=6291456"}, "uplink.lambda.max_bytes: must be between 65536 and 5767168"},
		{"negative max_items", nil, []string{"GATEWAY_UPLINK_LAMBDA_MAX_ITEMS=-1"}, "uplink.lambda.max_items: must be between 1 and 10000"},
		{"negative max_wait", nil, []string{"GATEWAY_UPLINK_LAMBDA_MAX_WAIT=-1ms"}, "uplink.lambda.max_wait: must not be negative"},
		{"unknown encoding", nil, []string{"GATEWAY_UPLINK_LAMBDA_ENCODING=brotli"}, `uplink.lambda.encoding: "brotli" must be one of zstd, gzip, none`},
		{"concurrency above max", nil, []string{"GATEWAY_UPLINK_LAMBDA_CONCURRENCY=20", "GATEWAY_UPLINK_LAMBDA_MAX_CONCURRENCY=10"}, "uplink.lambda.concurrency: must not exceed uplink.lambda.max_concurrency"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, _, err := loadConfig(tt.args, append(tt.env, "GATEWAY_API_KEY_PEPPER=x"))
			require.ErrorContains(t, err, tt.want)
		})
	}
}
