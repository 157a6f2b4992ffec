package uplink

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

type metrics struct {
	batches        *prometheus.CounterVec
	readings       prometheus.Counter
	retries        prometheus.Counter
	requestErrors  *prometheus.CounterVec
	requestSeconds *prometheus.HistogramVec
	unprocessed    prometheus.Counter
	requestItems   prometheus.Histogram
	deviceUpserts  prometheus.Counter
	up             prometheus.Gauge
	txLimit        prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	f := promauto.With(reg)
	m := &metrics{
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
			Help: "Forwarding rounds that failed and were retried after a backoff.",
		}),
		requestErrors: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "uplink", Name: "request_errors_total",
			Help: "Failed DynamoDB requests, by operation and kind.",
		}, []string{"operation", "kind"}),
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
		deviceUpserts: f.NewCounter(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "uplink", Name: "device_upserts_total",
			Help: "Device records written to the devices table.",
		}),
		up: f.NewGauge(prometheus.GaugeOpts{
			Namespace: "gateway", Subsystem: "uplink", Name: "up",
			Help: "1 while the last forwarding round succeeded, 0 while the uplink is failing.",
		}),
		txLimit: f.NewGauge(prometheus.GaugeOpts{
			Namespace: "gateway", Subsystem: "uplink", Name: "transaction_max_items",
			Help: "Actions per TransactWriteItems the endpoint accepts (configured or probed; 0 until known).",
		}),
	}
	for _, r := range []string{"delivered", "already_delivered", "dead_lettered"} {
		m.batches.WithLabelValues(r)
	}
	return m
}
