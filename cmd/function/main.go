// Command function is the readings function's Lambda bootstrap (runtime
// provided.al2023): it reads its configuration from the environment
// (function.ConfigFromEnv: API_KEY_PEPPER, TABLE_PREFIX, DYNAMODB_ENDPOINT,
// ...; LOG_LEVEL) and serves invocations with function.Observe(...).Handle,
// which logs one line per invocation and prints its EMF metrics. `make lambda`
// builds it into bin/lambda/bootstrap and bin/lambda/function.zip.
package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/lambda"

	"greenhouse-gateway/function"
	"greenhouse-gateway/internal/cloud"
)

func main() {
	level, levelErr := function.LogLevelFromEnv(os.Getenv)
	logger := slog.New(slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{Level: level}))
	f, err := setup(context.Background(), logger)
	if err = cmp.Or(levelErr, err); err != nil {
		logger.Error("the readings function cannot start", "err", err)
		os.Exit(1)
	}
	// One log line per invocation and its EMF metrics, on stdout: the
	// function's CloudWatch log stream.
	lambda.Start(function.Observe(f, os.Stdout).Handle)
}

func setup(ctx context.Context, logger *slog.Logger) (*function.Function, error) {
	cfg, err := function.ConfigFromEnv(os.Getenv)
	if err != nil {
		return nil, err
	}
	client, err := cloud.NewClient(ctx, cloud.Config{Endpoint: cfg.Endpoint}, cloud.WithConnections(cfg.WriteConcurrency))
	if err != nil {
		return nil, fmt.Errorf("DYNAMODB_ENDPOINT or the AWS configuration: %w", err)
	}
	return function.New(cfg, client, logger)
}
