package uplink

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"greenhouse-gateway/internal/tablewrite"
)

type metrics struct {
	batches       *prometheus.CounterVec
	readings      prometheus.Counter
	retries       prometheus.Counter
	requestErrors *prometheus.CounterVec
	// refusedRequests: tablewrite.RequestRefusedError by operation, cause.
	refusedRequests *prometheus.CounterVec
	requestSeconds  *prometheus.HistogramVec
	unprocessed     prometheus.Counter
	requestItems    prometheus.Histogram
	deviceUpserts   prometheus.Counter
	keyWrites       *prometheus.CounterVec
	up              prometheus.Gauge
	txLimit         prometheus.Gauge
	concurrency     prometheus.Gauge
	roundBatches    prometheus.Histogram
	waveBatches     prometheus.Histogram
	roundWait       prometheus.Histogram
	freshBatches    prometheus.Counter
	consumed        *prometheus.CounterVec
	lastDelivery    prometheus.Gauge

	reg prometheus.Registerer
}

// newMetrics registers the uplink's metrics on reg (nil: a private
// registry). It is long because it declares every metric with its help
// text in one place, where they are read together.
func newMetrics(reg prometheus.Registerer) *metrics {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	f := factory{promauto.With(reg)}
	batchBuckets := []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}
	m := &metrics{
		reg:             reg,
		concurrency:     f.gauge("concurrency", "DynamoDB requests the uplink may have in flight now (AIMD: grows on success, halves on throttling)."),
		roundBatches:    f.histogram("round_batches", "Batches per forwarding round.", batchBuckets),
		waveBatches:     f.histogram("wave_batches", "Batches per bulk write (one round's batches) in batch write mode.", batchBuckets),
		roundWait:       f.histogram("round_wait_seconds", "Wait for more batches before a round is sent: the adaptive wait (uplink.max_wait) or, while few batches are pending, the wait for the link (uplink.max_delay).", []float64{0, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30}),
		freshBatches:    f.counter("fresh_batches_total", "Batches of devices without a backlog forwarded ahead of other devices' backlog."),
		batches:         f.counterVec("batches_total", "Batches forwarded, by result: delivered, already_delivered (the cloud marker existed), dead_lettered.", "result"),
		readings:        f.counter("readings_total", "Readings of batches forwarded (delivered or already delivered)."),
		retries:         f.counter("retried_rounds_total", "Forwarding rounds, or while the cloud gave no answer the probes before them, that failed and were retried after a backoff."),
		requestErrors:   f.counterVec("request_errors_total", "Failed DynamoDB requests, by operation and kind.", "operation", "kind"),
		refusedRequests: f.counterVec("refused_requests_total", "DynamoDB requests refused for their shape or the endpoint's limits, not for a batch's content (a ValidationException of another kind than an item's data), by operation and cause (transaction_limit, request_limit, parameter, request); their batches are retried, never dead-lettered.", "operation", "cause"),
		requestSeconds:  f.histogramVec("request_duration_seconds", "DynamoDB request latency, by operation.", prometheus.ExponentialBuckets(0.002, 2, 14), "operation"),
		requestItems:    f.histogram("batch_write_items", "Items per BatchWriteItem request (at most 25).", []float64{1, 2, 5, 10, 15, 20, 25}),
		unprocessed:     f.counter("unprocessed_items_total", "Items BatchWriteItem returned unprocessed (throttling) and that were resent."),
		consumed:        f.counterVec("consumed_capacity_units_total", "Capacity units DynamoDB reported consumed by the uplink's requests, by operation (write units for writes, read units for BatchGetItem).", "operation"),
		deviceUpserts:   f.counter("device_upserts_total", "Device records written to the devices table."),
		keyWrites:       f.counterVec("device_key_writes_total", "Device keys written to api_keys, by kind: issued (at a device's enrollment), revoked (at an operator's reset).", "kind"),
		up:              f.gauge("up", "1 while the last forwarding round succeeded, 0 while the uplink is failing."),
		lastDelivery:    f.gauge("last_delivery_timestamp_seconds", "Unix time, by the gateway's corrected clock, when the uplink last recorded batches as delivered (0 until then)."),
		txLimit:         f.gauge("transaction_max_items", "Actions per TransactWriteItems the endpoint accepts (configured or probed; 0 until known)."),
	}
	for _, r := range []string{"delivered", "already_delivered", "dead_lettered"} {
		m.batches.WithLabelValues(r)
	}
	// The errors the dashboard shows from the start, at 0.
	for _, kind := range []string{"network", "timeout", "ProvisionedThroughputExceededException"} {
		m.requestErrors.WithLabelValues("BatchWriteItem", kind)
	}
	for _, cause := range tablewrite.RefusalCauses {
		m.refusedRequests.WithLabelValues("TransactWriteItems", cause)
	}
	return m
}

// factory makes the uplink's metrics, gateway_uplink_*, registered where
// its promauto.Factory registers.
type factory struct{ f promauto.Factory }

// The uplink's metrics' namespace and subsystem.
const (
	namespace = "gateway"
	subsystem = "uplink"
)

func opts(name, help string) prometheus.Opts {
	return prometheus.Opts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help}
}

func (f factory) counter(name, help string) prometheus.Counter {
	return f.f.NewCounter(prometheus.CounterOpts(opts(name, help)))
}

func (f factory) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return f.f.NewCounterVec(prometheus.CounterOpts(opts(name, help)), labels)
}

func (f factory) gauge(name, help string) prometheus.Gauge {
	return f.f.NewGauge(prometheus.GaugeOpts(opts(name, help)))
}

func (f factory) gaugeFunc(name, help string, value func() float64) {
	f.f.NewGaugeFunc(prometheus.GaugeOpts(opts(name, help)), value)
}

func (f factory) histogram(name, help string, buckets []float64) prometheus.Histogram {
	return f.f.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help, Buckets: buckets})
}

func (f factory) histogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return f.f.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help, Buckets: buckets}, labels)
}
