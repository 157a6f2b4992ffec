package uplink

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"greenhouse-gateway/function/event"
	"greenhouse-gateway/internal/cloud"
)

// Targets of the uplink (Config.Target).
const (
	// TargetDynamoDB writes the cloud tables directly.
	TargetDynamoDB = "dynamodb"
	// TargetLambda invokes the readings function with micro-batches of
	// device batches (the native batch event); the function writes the
	// tables.
	TargetLambda = "lambda"
)

// lambdaPayloadLimit is Lambda's limit on a synchronous request payload
// (6 MB); MaxBytes must stay under it with room for the event's envelope.
const (
	lambdaPayloadLimit = 6 << 20
	maxLambdaBytes     = lambdaPayloadLimit - 512<<10
	minLambdaBytes     = 64 << 10
)

// LambdaConfig configures the lambda target. The zero value of a field
// means its default.
type LambdaConfig struct {
	// Function is the readings function's name or ARN (also name:alias).
	// Required with the lambda target.
	Function string `yaml:"function"`
	// Endpoint is the Lambda API's URL, for local runs (the Runtime
	// Interface Emulator); empty means AWS itself.
	Endpoint string `yaml:"endpoint"`
	// MaxItems is how many device batches one invocation carries at most.
	// Default 200.
	MaxItems int `yaml:"max_items"`
	// MaxBytes bounds an invocation's event, under Lambda's 6 MB request
	// payload with room for the envelope. Default 5 MiB.
	MaxBytes int `yaml:"max_bytes"`
	// MaxWait bounds how long device batches ready to go wait for more
	// before an invocation is sent while others are in flight. The wait
	// follows the sigmoid of uplink.wait_target_rate and
	// uplink.wait_steepness applied to the rate at which batches become
	// ready: 0 at low rates, MaxWait at high ones. Default 50ms.
	MaxWait time.Duration `yaml:"max_wait"`
	// Concurrency is how many invocations may be in flight at start; it
	// then moves by AIMD between 1 and MaxConcurrency (halved at each
	// throttling answer). Default 4.
	Concurrency int `yaml:"concurrency"`
	// MaxConcurrency bounds the invocations in flight. Default 16 (or
	// Concurrency, when that is larger).
	MaxConcurrency int `yaml:"max_concurrency"`
	// Timeout bounds one invocation; a timed-out invocation's batches are
	// sent again (the function answers duplicate for those it wrote).
	// Default 60s.
	Timeout time.Duration `yaml:"timeout"`
	// ReportInterval is how often an idle uplink (nothing to send) invokes
	// the function with an empty event, so that the gateway's report
	// (pending batches, oldest pending age, deliveries, last error class,
	// which every event carries) reaches the cloud's metrics even when
	// nothing else does: the function's GatewayReports metric then shows
	// a silent gateway. The report goes when no invocation was answered
	// for this long. Default 1m.
	ReportInterval time.Duration `yaml:"report_interval"`
	// PoisonFailures is how many times a batch's forwarding may fail with
	// the same answer that follows the batch (a function error or an
	// invocation error on an invocation of that batch alone, found by
	// splitting the failing invocations, or a per-item error result),
	// each while other batches were delivered, before the batch is
	// dead-lettered with its last error and its device's later batches go
	// on. Failures while nothing else is delivered (an outage, a function
	// that fails on every batch) are not counted. Default 5.
	PoisonFailures int `yaml:"poison_failures"`
	// PoisonTime dead-letters such a batch at a counted failure this long
	// after its first, whatever the count; a batch answered with an error
	// result (the cloud's own trouble, which may pass) is dead-lettered
	// only once it has failed both PoisonFailures times and for this long.
	// Default 10m.
	PoisonTime time.Duration `yaml:"poison_time"`
	// Encoding is how events travel: zstd (the default) or gzip, the
	// event's JSON compressed in an envelope that names it (see
	// firmware-contract/CLOUD.md), or none, plain JSON, for a function
	// that predates compressed events. An event that would not come out
	// smaller goes plain.
	Encoding string `yaml:"encoding"`
}

// DefaultLambdaConfig returns the defaults documented on LambdaConfig.
func DefaultLambdaConfig() LambdaConfig {
	return LambdaConfig{MaxItems: 200, MaxBytes: 5 << 20, MaxWait: 50 * time.Millisecond,
		Concurrency: 4, MaxConcurrency: 16, Timeout: time.Minute, ReportInterval: time.Minute,
		PoisonFailures: 5, PoisonTime: 10 * time.Minute, Encoding: event.EncodingZstd}
}

// validate reports the first invalid field; target is uplink.target.
func (c LambdaConfig) validate(target string) error {
	switch {
	case target == TargetLambda && c.Function == "":
		return errors.New("uplink.lambda.function: must be set when uplink.target is lambda")
	case c.MaxItems < 0 || c.MaxItems > 10000:
		return errors.New("uplink.lambda.max_items: must be between 1 and 10000")
	case c.MaxBytes != 0 && (c.MaxBytes < minLambdaBytes || c.MaxBytes > maxLambdaBytes):
		return fmt.Errorf("uplink.lambda.max_bytes: must be between %d and %d (Lambda's 6 MB request payload less 512 KiB for the envelope)", minLambdaBytes, maxLambdaBytes)
	case c.MaxWait < 0:
		return errors.New("uplink.lambda.max_wait: must not be negative")
	}
	if err := validateConcurrency("uplink.lambda.", c.Concurrency, c.MaxConcurrency); err != nil {
		return err
	}
	if err := firstNegative(
		field{"uplink.lambda.timeout", int64(c.Timeout)},
		field{"uplink.lambda.report_interval", int64(c.ReportInterval)},
	); err != nil {
		return err
	}
	switch {
	case c.PoisonFailures < 0 || c.PoisonFailures > 1000:
		return errors.New("uplink.lambda.poison_failures: must be between 1 and 1000")
	case c.PoisonTime < 0:
		return errors.New("uplink.lambda.poison_time: must not be negative")
	case c.Encoding != "" && !slices.Contains(event.Encodings, c.Encoding):
		return fmt.Errorf("uplink.lambda.encoding: %q must be one of %s", c.Encoding, strings.Join(event.Encodings, ", "))
	}
	if err := (cloud.Config{Endpoint: c.Endpoint}).Validate(); err != nil {
		return fmt.Errorf("uplink.lambda.endpoint: %q must be an http or https URL with a host", c.Endpoint)
	}
	return nil
}

func (c LambdaConfig) withDefaults() LambdaConfig {
	d := DefaultLambdaConfig()
	c.MaxItems = cmp.Or(c.MaxItems, d.MaxItems)
	c.MaxBytes = cmp.Or(c.MaxBytes, d.MaxBytes)
	c.MaxWait = cmp.Or(c.MaxWait, d.MaxWait)
	c.Concurrency = cmp.Or(c.Concurrency, d.Concurrency)
	if c.MaxConcurrency == 0 {
		c.MaxConcurrency = max(d.MaxConcurrency, c.Concurrency)
	}
	c.Timeout = cmp.Or(c.Timeout, d.Timeout)
	c.ReportInterval = cmp.Or(c.ReportInterval, d.ReportInterval)
	c.PoisonFailures = cmp.Or(c.PoisonFailures, d.PoisonFailures)
	c.PoisonTime = cmp.Or(c.PoisonTime, d.PoisonTime)
	c.Encoding = cmp.Or(c.Encoding, d.Encoding)
	return c
}
