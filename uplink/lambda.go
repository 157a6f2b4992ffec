package uplink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"greenhouse-gateway/function/event"
)

// Invoker is the part of the Lambda API the lambda target uses.
type Invoker interface {
	Invoke(context.Context, *lambda.InvokeInput, ...func(*lambda.Options)) (*lambda.InvokeOutput, error)
}

// lambdaTarget is the sink of the lambda target: it invokes the readings
// function with the native batch event (microbatch.go).
type lambdaTarget struct {
	u         *Uplink
	cfg       LambdaConfig
	inv       Invoker
	gatewayID string
	limiter   *aimd     // invocations in flight
	ready     *ewmaRate // device batches becoming ready to send, per second
	metrics   *lambdaMetrics
	reports   *reportState // what each event's report says
	started   time.Time    // New's time: the idle report's first due time counts from it
	poison    poisonState  // suspected poison batches (poison.go)
	history   deliveredHistory
}

// newLambdaTarget returns the lambda target of u, invoking the readings
// function through inv with the gateway's id in every event.
func newLambdaTarget(u *Uplink, inv Invoker, gatewayID string) *lambdaTarget {
	lc := u.cfg.Lambda
	m := newLambdaMetrics(u.metrics.reg)
	return &lambdaTarget{u: u, cfg: lc, inv: inv, gatewayID: gatewayID, metrics: m,
		limiter: newAIMD(lc.Concurrency, lc.MaxConcurrency, func(n int) { m.concurrency.Set(float64(n)) }),
		ready:   newEWMARate(time.Second),
		reports: &reportState{u: u}, started: time.Now(),
	}
}

// prepare does nothing: the function's DynamoDB answers correct its own
// clock, and it sends no device record ahead of a round.
func (t *lambdaTarget) prepare(context.Context) error { return nil }

// reach invokes the readings function with an empty event, which it
// answers with no results, writing nothing.
func (t *lambdaTarget) reach(ctx context.Context) error {
	_, err := t.invoke(ctx, &event.BatchEvent{})
	return err
}

// invocationError is an invocation that failed as a whole; none of its
// results are known.
type invocationError struct {
	kind string // metrics label: throttled, function_error, error
	err  error
}

func (e *invocationError) Error() string { return e.err.Error() }
func (e *invocationError) Unwrap() error { return e.err }

// invoke sends one event and returns the function's results by id. It
// waits for a slot of the invocations' AIMD limit; a throttling answer
// (TooManyRequestsException, HTTP 429, or a throttled result) halves it.
func (t *lambdaTarget) invoke(ctx context.Context, ev *event.BatchEvent) (map[string]event.ItemResult, error) {
	gen, err := t.limiter.acquire(ctx)
	if err != nil {
		return nil, err
	}
	// The report is taken once a slot is free, so that it says how things
	// stand when the event goes.
	report, reported := t.reports.take()
	ev.V, ev.Kind, ev.GatewayID, ev.Report = event.EventVersion, event.KindGatewayBatches, t.gatewayID, report
	payload, err := event.Marshal(ev, t.cfg.Encoding)
	if err != nil {
		t.limiter.release(gen, outcomeSuccess, "", 0)
		reported(false)
		return nil, fmt.Errorf("encoding the batch event: %w", err)
	}
	ictx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	start := time.Now()
	out, err := t.inv.Invoke(ictx, &lambda.InvokeInput{FunctionName: aws.String(t.cfg.Function), Payload: payload})
	t.metrics.seconds.Observe(time.Since(start).Seconds())
	t.metrics.batches.Observe(float64(len(ev.Items)))
	results, err := answerOf(out, err)
	reported(err == nil)
	if err != nil {
		t.reports.failed(err, false)
	}
	o := outcomeSuccess
	switch {
	case err != nil && invocationKind(err) == "throttled":
		o = outcomeThrottled
	case err != nil:
		o = outcomeOther
	case anyThrottled(results):
		o = outcomeThrottled
	}
	// An invocation's duration follows its batches and the function's
	// own writes, not a queue: only its outcome steers the limit.
	t.limiter.release(gen, o, "", 0)
	if err != nil {
		t.metrics.invocations.WithLabelValues(invocationKind(err)).Inc()
		return nil, fmt.Errorf("invoking %s with %d batches, %d device records, %d keys: %w",
			t.cfg.Function, len(ev.Items), len(ev.Devices), len(ev.Keys), err)
	}
	t.metrics.invocations.WithLabelValues("ok").Inc()
	return results, nil
}

// answerOf turns an Invoke answer into the function's results by id.
func answerOf(out *lambda.InvokeOutput, err error) (map[string]event.ItemResult, error) {
	if err != nil {
		var ae smithy.APIError
		var re *smithyhttp.ResponseError
		if (errors.As(err, &ae) && ae.ErrorCode() == "TooManyRequestsException") ||
			(errors.As(err, &re) && re.HTTPStatusCode() == 429) {
			return nil, &invocationError{kind: "throttled", err: err}
		}
		return nil, &invocationError{kind: "error", err: err}
	}
	if out.FunctionError != nil {
		return nil, &invocationError{kind: "function_error", err: fmt.Errorf("function error %s: %.200s",
			aws.ToString(out.FunctionError), out.Payload)}
	}
	var a struct {
		event.BatchResponse
		// A function error the Runtime Interface Emulator answers
		// without X-Amz-Function-Error.
		ErrorType    string `json:"errorType"`
		ErrorMessage string `json:"errorMessage"`
	}
	if err := json.Unmarshal(out.Payload, &a); err != nil {
		return nil, &invocationError{kind: "error", err: fmt.Errorf("decoding the function's answer: %w", err)}
	}
	if a.V == 0 && a.Results == nil && a.ErrorType != "" {
		return nil, &invocationError{kind: "function_error", err: fmt.Errorf("function error %s: %.200s", a.ErrorType, a.ErrorMessage)}
	}
	results := make(map[string]event.ItemResult, len(a.Results))
	for _, r := range a.Results {
		results[r.ID] = r
	}
	return results, nil
}

// invocationKind labels an invocation error for metrics.
func invocationKind(err error) string {
	var ie *invocationError
	if errors.As(err, &ie) {
		return ie.kind
	}
	return "error"
}

func anyThrottled(results map[string]event.ItemResult) bool {
	for _, r := range results {
		if r.Status == event.StatusThrottled {
			return true
		}
	}
	return false
}

// resultError is a result that is neither delivered nor a permanent
// refusal: the item is retried.
func resultError(id string, r event.ItemResult, ok bool) error {
	if !ok {
		return &resultErr{msg: fmt.Sprintf("the function's answer has no result for id %s", id)}
	}
	return &resultErr{status: r.Status, msg: fmt.Sprintf("the function answered %s for id %s: %s %s", r.Status, id, r.Reason, r.Message)}
}

// resultLabel is a result's status for metrics; "missing" when the answer
// had none for the id.
func resultLabel(r event.ItemResult, ok bool) string {
	switch {
	case !ok:
		return "missing"
	case r.Status == event.StatusDelivered, r.Status == event.StatusDuplicate, r.Status == event.StatusConflict,
		r.Status == event.StatusRejected, r.Status == event.StatusThrottled, r.Status == event.StatusError:
		return r.Status
	}
	return "other"
}

type lambdaMetrics struct {
	invocations *prometheus.CounterVec
	batches     prometheus.Histogram
	seconds     prometheus.Histogram
	results     *prometheus.CounterVec
	concurrency prometheus.Gauge
	splits      prometheus.Counter
}

func newLambdaMetrics(reg prometheus.Registerer) *lambdaMetrics {
	f := factory{promauto.With(reg)}
	m := &lambdaMetrics{
		invocations: f.counterVec("lambda_invocations_total", "Invocations of the readings function, by outcome: ok (an answer with per-id results), throttled (TooManyRequestsException, 429), function_error (X-Amz-Function-Error), error (network, timeout, other).", "outcome"),
		batches:     f.histogram("lambda_invocation_batches", "Device batches per invocation of the readings function (0: device records and keys only, or an empty event: a probe or an idle report).", []float64{0, 1, 2, 5, 10, 25, 50, 100, 200, 500, 1000}),
		seconds:     f.histogram("lambda_invocation_duration_seconds", "Latency of one invocation of the readings event.", prometheus.ExponentialBuckets(0.005, 2, 14)),
		results:     f.counterVec("lambda_results_total", "Per-id results of the readings function, by status: delivered, duplicate, conflict, rejected, throttled, error, missing (no result for an id), other.", "status"),
		concurrency: f.gauge("lambda_concurrency", "Invocations the uplink may have in flight now (AIMD: grows on success, halves on throttling)."),
		splits:      f.counter("lambda_invocation_splits_total", "Failed invocations of several batches sent again as two halves, to find the batch that makes them fail (a function error, or another invocation error while other batches are delivered)."),
	}
	for _, o := range []string{"ok", "throttled", "function_error", "error"} {
		m.invocations.WithLabelValues(o)
	}
	return m
}
