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
	f := promauto.With(reg)
	batchBuckets := []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}
	m := &metrics{
		reg: reg,
		concurrency: f.NewGauge(prometheus.GaugeOpts{
			Namespace: "gateway", Subsystem: "uplink", Name: "concurrency",
			Help: "DynamoDB requests the uplink may have in flight now (AIMD: grows on success, halves on throttling).",
		}),
		roundBatches: f.NewHistogram(prometheus.HistogramOpts{
			Namespace: "gateway", Subsystem: "uplink", Name: "round_batches",
			Help:    "Batches per forwarding round.",
			Buckets: batchBuckets,
		}),
		waveBatches: f.NewHistogram(prometheus.HistogramOpts{
			Namespace: "gateway", Subsystem: "uplink", Name: "wave_batches",
			Help:    "Batches per bulk write (one round's batches) in batch write mode.",
			Buckets: batchBuckets,
		}),
		roundWait: f.NewHistogram(prometheus.HistogramOpts{
			Namespace: "gateway", Subsystem: "uplink", Name: "round_wait_seconds",
			Help:    "Adaptive wait for more batches before a round is sent (0 at low arrival rates).",
			Buckets: []float64{0, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2},
		}),
		freshBatches: f.NewCounter(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "uplink", Name: "fresh_batches_total",
			Help: "Batches of devices without a backlog forwarded ahead of other devices' backlog.",
		}),
		batches: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "uplink", Name: "batches_total",
			Help: "Batches forwarded, by result: delivered, already_delivered (the cloud marker existed), dead_lettered.",
		}, []string{"result"}),
		readings: f.NewCounter(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "uplink", Name: "readings_total",
			Help: "Readings of batches forwarded (delivered or already delivered).",
		}),
		retries: f.NewCounter(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "uplink", Name: "retried_rounds_total",
			Help: "Forwarding rounds, or while the cloud gave no answer the probes before them, that failed and were retried after a backoff.",
		}),
		requestErrors: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "uplink", Name: "request_errors_total",
			Help: "Failed DynamoDB requests, by operation and kind.",
		}, []string{"operation", "kind"}),
		refusedRequests: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "uplink", Name: "refused_requests_total",
			Help: "DynamoDB requests refused for their shape or the endpoint's limits, not for a batch's content (a ValidationException of another kind than an item's data), by operation and cause (transaction_limit, request_limit, parameter, request); their batches are retried, never dead-lettered.",
		}, []string{"operation", "cause"}),
		requestSeconds: f.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "gateway", Subsystem: "uplink", Name: "request_duration_seconds",
			Help:    "DynamoDB request latency, by operation.",
			Buckets: prometheus.ExponentialBuckets(0.002, 2, 14),
		}, []string{"operation"}),
		requestItems: f.NewHistogram(prometheus.HistogramOpts{
			Namespace: "gateway", Subsystem: "uplink", Name: "batch_write_items",
			Help:    "Items per BatchWriteItem request (at most 25).",
			Buckets: []float64{1, 2, 5, 10, 15, 20, 25},
		}),
		unprocessed: f.NewCounter(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "uplink", Name: "unprocessed_items_total",
			Help: "Items BatchWriteItem returned unprocessed (throttling) and that were resent.",
		}),
		consumed: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "uplink", Name: "consumed_capacity_units_total",
			Help: "Capacity units DynamoDB reported consumed by the uplink's requests, by operation (write units for writes, read units for BatchGetItem).",
		}, []string{"operation"}),
		deviceUpserts: f.NewCounter(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "uplink", Name: "device_upserts_total",
			Help: "Device records written to the devices table.",
		}),
		keyWrites: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "uplink", Name: "device_key_writes_total",
			Help: "Device keys written to api_keys, by kind: issued (at a device's enrollment), revoked (at an operator's reset).",
		}, []string{"kind"}),
		up: f.NewGauge(prometheus.GaugeOpts{
			Namespace: "gateway", Subsystem: "uplink", Name: "up",
			Help: "1 while the last forwarding round succeeded, 0 while the uplink is failing.",
		}),
		lastDelivery: f.NewGauge(prometheus.GaugeOpts{
			Namespace: "gateway", Subsystem: "uplink", Name: "last_delivery_timestamp_seconds",
			Help: "Unix time, by the gateway's corrected clock, when the uplink last recorded batches as delivered (0 until then).",
		}),
		txLimit: f.NewGauge(prometheus.GaugeOpts{
			Namespace: "gateway", Subsystem: "uplink", Name: "transaction_max_items",
			Help: "Actions per TransactWriteItems the endpoint accepts (configured or probed; 0 until known).",
		}),
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
