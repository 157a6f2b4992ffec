package buffer

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

type metrics struct {
	outcomes       *prometheus.CounterVec
	commitFailures prometheus.Counter
	groupBatches   prometheus.Histogram
	commitSeconds  prometheus.Histogram
	delivered      prometheus.Counter
	deadLettered   prometheus.Counter
	collected      prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, b *Buffer) *metrics {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	f := promauto.With(reg)
	m := &metrics{
		outcomes: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "buffer", Name: "commit_batches_total",
			Help: "Batches offered to the buffer, by outcome (stored, duplicate, conflict, full).",
		}, []string{"outcome"}),
		commitFailures: f.NewCounter(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "buffer", Name: "commit_failures_total",
			Help: "Group commits that failed; none of their batches were acknowledged.",
		}),
		groupBatches: f.NewHistogram(prometheus.HistogramOpts{
			Namespace: "gateway", Subsystem: "buffer", Name: "commit_group_batches",
			Help:    "Batches per group commit (one fsync each).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11),
		}),
		commitSeconds: f.NewHistogram(prometheus.HistogramOpts{
			Namespace: "gateway", Subsystem: "buffer", Name: "commit_duration_seconds",
			Help:    "Time to decide and durably write one commit group.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		delivered: f.NewCounter(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "buffer", Name: "delivered_batches_total",
			Help: "Batches removed from the queue after delivery.",
		}),
		deadLettered: f.NewCounter(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "buffer", Name: "dead_lettered_batches_total",
			Help: "Batches moved to the dead-letter area after a permanent cloud refusal.",
		}),
		collected: f.NewCounter(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "buffer", Name: "collected_markers_total",
			Help: "Delivery markers deleted after the retention window.",
		}),
	}
	for _, o := range []Outcome{Stored, Duplicate, Conflict, Full} {
		m.outcomes.WithLabelValues(o.String())
	}
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "gateway", Subsystem: "buffer", Name: "pending_batches",
		Help: "Batches stored and not yet delivered.",
	}, func() float64 { return float64(b.pendingBatches.Load()) })
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "gateway", Subsystem: "buffer", Name: "pending_bytes",
		Help: "Bytes of batches stored and not yet delivered.",
	}, func() float64 { return float64(b.pendingBytes.Load()) })
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "gateway", Subsystem: "buffer", Name: "oldest_pending_age_seconds",
		Help: "Age of the oldest undelivered batch; 0 when none is pending.",
	}, func() float64 {
		s := b.Stats()
		if s.Oldest.IsZero() {
			return 0
		}
		return time.Since(s.Oldest).Seconds()
	})
	return m
}
