package function

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambdacontext"

	"greenhouse-gateway/function/event"
	"greenhouse-gateway/internal/tablewrite"
)

// The function's observability: one structured log line per invocation
// (at level info, so LOG_LEVEL=warn silences it) and CloudWatch Embedded
// Metric Format documents, one JSON object a line on stdout, which
// CloudWatch Logs turns into metrics of MetricNamespace: no SDK call and
// no permission beyond writing the function's own logs. Metrics are
// written whatever LOG_LEVEL says.
//
// Per invocation:
//   - one document of the invocation's metrics (dimension FunctionName);
//   - one document per batch status that occurred (dimensions
//     FunctionName, Status): Batches and Readings;
//   - for a gateway_batches event with a report, one document of the
//     gateway's uplink state (dimensions FunctionName, GatewayId).

// MetricNamespace is the CloudWatch namespace of the function's metrics.
const MetricNamespace = "GreenhouseGateway"

// Dimension names of the function's metrics.
const (
	DimFunctionName = "FunctionName"
	DimStatus       = "Status"
	DimGatewayID    = "GatewayId"
)

// Metric is one metric the function emits: its name, unit and dimension
// names (always in this order).
type Metric struct {
	Name       string
	Unit       string
	Dimensions []string
}

var (
	dimsFunction = []string{DimFunctionName}
	dimsStatus   = []string{DimFunctionName, DimStatus}
	dimsGateway  = []string{DimFunctionName, DimGatewayID}
)

// Metrics are every metric the function emits. Status takes the values of
// BatchStatuses.
var Metrics = []Metric{
	// One document per invocation.
	{"Duration", "Milliseconds", dimsFunction},      // the handler's time
	{"BatchesPerInvocation", "Count", dimsFunction}, // device batches in the event or request
	{"Throttles", "Count", dimsFunction},            // batches, device records and keys DynamoDB throttled
	{"Conflicts", "Count", dimsFunction},            // batches answered conflict
	{"DeadLetters", "Count", dimsFunction},          // batches answered conflict or rejected: refused for good
	{"ReadCapacity", "Count", dimsFunction},         // read capacity units DynamoDB reported (ReturnConsumedCapacity TOTAL)
	{"WriteCapacity", "Count", dimsFunction},        // write capacity units, the same
	// One per status that occurred.
	{"Batches", "Count", dimsStatus},  // device batches by status
	{"Readings", "Count", dimsStatus}, // their readings
	// One per gateway report.
	{"GatewayPendingBatches", "Count", dimsGateway},     // event.UplinkReport.PendingBatches
	{"GatewayOldestPendingAge", "Seconds", dimsGateway}, // event.UplinkReport.OldestPendingAgeSeconds
	{"GatewayDeliveredBatches", "Count", dimsGateway},   // event.UplinkReport.DeliveredBatches
	{"GatewayUplinkErrors", "Count", dimsGateway},       // 1 when the report has a LastErrorClass, else 0
	{"GatewayReports", "Count", dimsGateway},            // 1 per report received
}

// MetricOf returns the declaration of the metric name (Metrics).
func MetricOf(name string) (unit string, dims []string, ok bool) {
	for _, m := range Metrics {
		if m.Name == name {
			return m.Unit, m.Dimensions, true
		}
	}
	return "", nil, false
}

// BatchStatuses are the values of the Status dimension: the statuses of a
// gateway_batches answer (event.StatusDelivered ...), which POST
// /v1/readings answers map to (accepted is delivered).
var BatchStatuses = []string{event.StatusDelivered, event.StatusDuplicate, event.StatusConflict,
	event.StatusRejected, event.StatusThrottled, event.StatusError}

// Observer is the Lambda handler of a Function: it answers each
// invocation with the function and logs and measures it.
type Observer struct {
	f   *Function
	mu  sync.Mutex
	out io.Writer
}

// Observe returns f's handler, writing EMF documents to metrics (the
// Lambda bootstrap: os.Stdout; nil: none) and the invocation's log line
// to f's logger.
func Observe(f *Function, metrics io.Writer) *Observer { return &Observer{f: f, out: metrics} }

// LogLevelFromEnv reads LOG_LEVEL through getenv: debug, info (the
// default), warn or error.
func LogLevelFromEnv(getenv func(string) string) (slog.Level, error) {
	var l slog.Level
	s := getenv("LOG_LEVEL")
	if s == "" {
		return slog.LevelInfo, nil
	}
	if err := l.UnmarshalText([]byte(s)); err != nil || !slices.Contains([]string{"debug", "info", "warn", "error"}, strings.ToLower(s)) {
		return l, fmt.Errorf("LOG_LEVEL: %q is not one of debug, info, warn, error", s)
	}
	return l, nil
}

// invocation is what one invocation did, for its log line and metrics.
type invocation struct {
	mu          sync.Mutex
	event       string // gateway_batches, http, unknown
	route       string
	requestID   string // Lambda's request id
	apiRequest  string // API Gateway's request id
	correlation string // Idempotency-Key, or the body's request_id
	gatewayID   string
	report      *event.UplinkReport
	devices     []string
	batches     map[string]int // by status
	readings    map[string]int
	throttles   int
	statusCode  int
	encoding    string // a gateway_batches event's: none, gzip, zstd
	eventBytes  int    // its size as invoked
	// readUnits and writeUnits are the capacity units DynamoDB reported
	// for the invocation's reads (Query, GetItem, BatchGetItem) and
	// writes.
	readUnits, writeUnits float64
	// phases is the handler's time by step of storing batches (markers,
	// history, writes), in milliseconds.
	phases map[string]float64
	// hinted counts the devices whose newest readings came with the
	// event (event.HistoryHint), queried the devices whose were read.
	hinted, queried int
}

// consumed adds the capacity units a DynamoDB request of operation op
// reported.
func (inv *invocation) consumed(op string, units float64) {
	if inv == nil || units == 0 {
		return
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	switch op {
	case "Query", "GetItem", "BatchGetItem", "Scan":
		inv.readUnits += units
	default:
		inv.writeUnits += units
	}
}

// phase adds the time since start to step name.
func (inv *invocation) phase(name string, start time.Time) {
	if inv == nil {
		return
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if inv.phases == nil {
		inv.phases = map[string]float64{}
	}
	inv.phases[name] += durationMS(time.Since(start))
}

// history notes where a device's newest readings came from.
func (inv *invocation) history(hinted bool) {
	if inv == nil {
		return
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if hinted {
		inv.hinted++
	} else {
		inv.queried++
	}
}

type invocationKey struct{}

// observed returns ctx's invocation; nil outside Handle (every method
// takes a nil receiver).
func observed(ctx context.Context) *invocation {
	inv, _ := ctx.Value(invocationKey{}).(*invocation)
	return inv
}

// Handle answers one invocation (Function.Handle) and logs and measures
// it.
func (o *Observer) Handle(ctx context.Context, raw json.RawMessage) (any, error) {
	start := time.Now()
	inv := &invocation{event: "unknown", batches: map[string]int{}, readings: map[string]int{}}
	if lc, ok := lambdacontext.FromContext(ctx); ok {
		inv.requestID = lc.AwsRequestID
	}
	out, err := o.f.Handle(context.WithValue(ctx, invocationKey{}, inv), raw)
	if resp, ok := out.(events.APIGatewayV2HTTPResponse); ok {
		inv.statusCode = resp.StatusCode
	}
	o.finish(ctx, inv, time.Since(start), err)
	return out, err
}

// gatewayEvent notes a gateway_batches event.
func (inv *invocation) gatewayEvent(ev BatchEvent) {
	if inv == nil {
		return
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	inv.event, inv.gatewayID, inv.report = KindGatewayBatches, ev.GatewayID, ev.Report
}

// encoded notes how a gateway_batches event came: its encoding and its
// size as invoked.
func (inv *invocation) encoded(encoding string, size int) {
	if inv == nil {
		return
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	inv.encoding, inv.eventBytes = encoding, size
}

// httpRequest notes an API Gateway request: its route and correlation id.
func (inv *invocation) httpRequest(req events.APIGatewayV2HTTPRequest) {
	if inv == nil {
		return
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	inv.event = "http"
	inv.route = req.RequestContext.HTTP.Method + " " + req.RawPath
	inv.apiRequest = req.RequestContext.RequestID
	for k, v := range req.Headers {
		if strings.EqualFold(k, "Idempotency-Key") {
			inv.correlation = v
		}
	}
	if inv.correlation == "" && req.RequestContext.HTTP.Method == http.MethodPost && !req.IsBase64Encoded {
		var top struct {
			RequestID string `json:"request_id"`
		}
		if json.Unmarshal([]byte(req.Body), &top) == nil {
			inv.correlation = top.RequestID
		}
	}
}

// jobs counts settled jobs by status, with their readings and devices.
func (inv *invocation) jobs(jobs []*job) {
	if inv == nil {
		return
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	for _, j := range jobs {
		s := j.outcome.String()
		inv.batches[s]++
		if j.batch != nil {
			inv.readings[s] += len(j.batch.Readings)
			if hw := j.batch.HardwareID; hw != "" && !slices.Contains(inv.devices, hw) {
				inv.devices = append(inv.devices, hw)
			}
		}
		if j.outcome == tablewrite.Throttled {
			inv.throttles++
		}
	}
}

// writes counts the throttled device records and keys of a
// gateway_batches answer (its batches are counted by jobs).
func (inv *invocation) writes(results []ItemResult) {
	if inv == nil {
		return
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	for _, r := range results {
		if r.Status == StatusThrottled {
			inv.throttles++
		}
	}
}

// finish writes the invocation's log line and metrics.
func (o *Observer) finish(ctx context.Context, inv *invocation, d time.Duration, err error) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	total := 0
	for _, n := range inv.batches {
		total += n
	}
	attrs := []slog.Attr{slog.String("event", inv.event), slog.String("request_id", inv.requestID)}
	if inv.correlation != "" {
		attrs = append(attrs, slog.String("correlation_id", inv.correlation))
	}
	if inv.apiRequest != "" {
		attrs = append(attrs, slog.String("api_request_id", inv.apiRequest))
	}
	if inv.route != "" {
		attrs = append(attrs, slog.String("route", inv.route))
	}
	if inv.gatewayID != "" {
		attrs = append(attrs, slog.String("gateway_id", inv.gatewayID))
	}
	if inv.encoding != "" {
		attrs = append(attrs, slog.String("encoding", inv.encoding), slog.Int("event_bytes", inv.eventBytes))
	}
	switch len(inv.devices) {
	case 0:
	case 1:
		attrs = append(attrs, slog.String("hardware_id", inv.devices[0]))
	default:
		attrs = append(attrs, slog.Int("devices", len(inv.devices)))
	}
	if inv.statusCode != 0 {
		attrs = append(attrs, slog.Int("status_code", inv.statusCode))
	}
	attrs = append(attrs, slog.Any("batches", inv.batches), slog.Any("readings", inv.readings),
		slog.Float64("duration_ms", durationMS(d)), slog.Float64("read_units", inv.readUnits),
		slog.Float64("write_units", inv.writeUnits))
	if inv.phases != nil {
		attrs = append(attrs, slog.Any("phases_ms", inv.phases))
	}
	if inv.hinted+inv.queried > 0 {
		attrs = append(attrs, slog.Int("history_hinted", inv.hinted), slog.Int("history_queried", inv.queried))
	}
	if inv.report != nil {
		attrs = append(attrs, slog.Any("report", inv.report))
	}
	level := slog.LevelInfo
	if err != nil {
		level = slog.LevelError
		attrs = append(attrs, slog.String("err", err.Error()))
	}
	o.f.logger.LogAttrs(ctx, level, "invocation", attrs...)

	o.mu.Lock()
	defer o.mu.Unlock()
	if o.out == nil {
		return
	}
	fn := functionName()
	now := time.Now()
	docs := []emfDoc{{dims: dimsFunction, values: map[string]any{DimFunctionName: fn}, metrics: map[string]float64{
		"Duration": durationMS(d), "BatchesPerInvocation": float64(total), "Throttles": float64(inv.throttles),
		"Conflicts":     float64(inv.batches[StatusConflict]),
		"DeadLetters":   float64(inv.batches[StatusConflict] + inv.batches[StatusRejected]),
		"ReadCapacity":  inv.readUnits,
		"WriteCapacity": inv.writeUnits,
	}}}
	for _, s := range BatchStatuses {
		if n := inv.batches[s]; n > 0 {
			docs = append(docs, emfDoc{dims: dimsStatus, values: map[string]any{DimFunctionName: fn, DimStatus: s},
				metrics: map[string]float64{"Batches": float64(n), "Readings": float64(inv.readings[s])}})
		}
	}
	if r := inv.report; r != nil && validGatewayID(inv.gatewayID) {
		errs := 0.0
		values := map[string]any{DimFunctionName: fn, DimGatewayID: inv.gatewayID}
		if r.LastErrorClass != "" {
			errs = 1
			values["LastErrorClass"] = r.LastErrorClass // a property: searchable in the logs, not a dimension
		}
		docs = append(docs, emfDoc{dims: dimsGateway, values: values, metrics: map[string]float64{
			"GatewayPendingBatches": float64(r.PendingBatches), "GatewayOldestPendingAge": r.OldestPendingAgeSeconds,
			"GatewayDeliveredBatches": float64(r.DeliveredBatches), "GatewayUplinkErrors": errs, "GatewayReports": 1,
		}})
	}
	for _, doc := range docs {
		line, err := doc.encode(now)
		if err != nil {
			o.f.logger.Warn("an EMF document was not encoded", "err", err)
			continue
		}
		if _, err := o.out.Write(line); err != nil {
			o.f.logger.Warn("an EMF document was not written", "err", err)
			return
		}
	}
}

func durationMS(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// functionName is the Lambda function's name (AWS_LAMBDA_FUNCTION_NAME),
// "function" where it is not set.
func functionName() string {
	if lambdacontext.FunctionName != "" {
		return lambdacontext.FunctionName
	}
	return "function"
}

// emfDoc is one EMF document: metrics of one dimension set.
type emfDoc struct {
	dims    []string
	values  map[string]any // dimension values and properties
	metrics map[string]float64
}

type emfMetric struct {
	Name string `json:"Name"`
	Unit string `json:"Unit"`
}

type emfDirective struct {
	Namespace  string      `json:"Namespace"`
	Dimensions [][]string  `json:"Dimensions"`
	Metrics    []emfMetric `json:"Metrics"`
}

// encode returns the document as one line: the dimension values,
// properties and metric values at the root, the _aws metadata naming
// them.
func (d emfDoc) encode(now time.Time) ([]byte, error) {
	dir := emfDirective{Namespace: MetricNamespace, Dimensions: [][]string{d.dims}}
	root := make(map[string]any, len(d.values)+len(d.metrics)+1)
	for k, v := range d.values {
		root[k] = v
	}
	for _, name := range slices.Sorted(maps.Keys(d.metrics)) {
		unit, _, ok := MetricOf(name)
		if !ok {
			return nil, fmt.Errorf("metric %s is not in Metrics", name)
		}
		dir.Metrics = append(dir.Metrics, emfMetric{Name: name, Unit: unit})
		root[name] = d.metrics[name]
	}
	root["_aws"] = map[string]any{"Timestamp": now.UnixMilli(), "CloudWatchMetrics": []emfDirective{dir}}
	b, err := json.Marshal(root)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// validGatewayID reports whether a gateway's id (self-asserted in its
// events: the host name) may be a metric dimension: 1 to 128 characters
// of letters, digits and ._:- . CloudWatch drops a whole EMF document with
// a dimension value it cannot take, and an unbounded id is unbounded
// custom metrics; a report with another id is logged, not measured.
func validGatewayID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, c := range id {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._:-", c)
		if !ok {
			return false
		}
	}
	return true
}
