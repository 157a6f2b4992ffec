// Package function is the readings function: an AWS Lambda handler that
// serves the device contract's HTTP API through API Gateway (HTTP API,
// payload format 2.0: POST /v1/readings and POST /v1/register) and the
// native batch event a gateway's uplink invokes it with (kind
// "gateway_batches"). It writes the tables of the locked schema through
// internal/tablewrite, the same code as the gateway's direct uplink, and
// authenticates devices with the api_keys table through internal/cloud.
// Operators read the tables through it too (read.go: GET /v1/devices and a
// device's item, readings and summaries, answered by the gateway's query
// code through internal/cloudread), only with API Gateway's AWS_IAM
// authorization.
//
// The function holds no state that matters between invocations: batch
// idempotency is the processed_batches marker with its payload hash, the
// ordering rule and the quality score read the device's newest readings,
// and a request's Idempotency-Key answer is an item in processed_batches.
package function

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/lambdacontext"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/tablewrite"
)

// Function handles the invocations of one Lambda execution environment.
type Function struct {
	cfg    Config
	db     *dynamodb.Client
	writer *tablewrite.Writer
	keys   *cloud.Keys
	logger *slog.Logger
	now    func() time.Time

	mu      sync.Mutex
	touched map[string]time.Time // key_id → last_used_at written by this environment
	limit   txLimit
}

// New returns the function; it does no I/O. logger nil discards logs.
func New(cfg Config, db *dynamodb.Client, logger *slog.Logger) (*Function, error) {
	if db == nil {
		return nil, errors.New("function: a DynamoDB client is required")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	f := &Function{
		cfg:     cfg,
		db:      db,
		keys:    cloud.NewKeys(db, cfg.Tables.APIKeys, cfg.Pepper),
		logger:  logger,
		now:     time.Now,
		touched: map[string]time.Time{},
	}
	f.writer = tablewrite.New(db, cfg.Tables, tablewrite.Options{Call: f.call, ConsumedCapacity: true})
	return f, nil
}

// errUnknownEvent is an invocation that is neither event.
var errUnknownEvent = errors.New(`the event is neither an API Gateway HTTP API request (payload format 2.0) nor {"kind":"gateway_batches"}`)

// Handle answers one invocation: a native batch event with a
// BatchResponse, an API Gateway request with its HTTP response. An error
// is an event the function cannot read at all.
func (f *Function) Handle(ctx context.Context, event json.RawMessage) (any, error) {
	var probe struct {
		Kind    string `json:"kind"`
		Version string `json:"version"`
	}
	if err := json.Unmarshal(event, &probe); err != nil {
		return nil, fmt.Errorf("reading the event: %w", err)
	}
	switch {
	case probe.Kind == KindGatewayBatches:
		ev, encoding, err := decodeBatchEvent(event)
		if err != nil {
			return nil, fmt.Errorf("reading the gateway_batches event: %w", err)
		}
		observed(ctx).encoded(encoding, len(event))
		return f.HandleBatches(ctx, ev)
	case probe.Version == "2.0":
		if !f.viaHTTPAlias(ctx) {
			return nil, errNotViaAPI
		}
		return f.handleHTTPEvent(ctx, event)
	}
	return nil, errUnknownEvent
}

// errNotViaAPI refuses an API Gateway event invoked other than through
// Config.HTTPAlias.
var errNotViaAPI = errors.New("an HTTP API event must come through the API's alias (HTTP_ALIAS); this invocation did not")

// viaHTTPAlias reports whether the invocation came through Config.HTTPAlias
// (always, when it is unset): only Lambda sets the invoked ARN, so a
// direct invoke of the function cannot pass for API Gateway's.
func (f *Function) viaHTTPAlias(ctx context.Context) bool {
	if f.cfg.HTTPAlias == "" {
		return true
	}
	lc, ok := lambdacontext.FromContext(ctx)
	return ok && strings.HasSuffix(lc.InvokedFunctionArn, ":"+f.cfg.HTTPAlias)
}
