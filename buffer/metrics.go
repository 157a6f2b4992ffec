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
	commitWait     prometheus.Histogram
	delivered      prometheus.Counter
	deadLettered   prometheus.Counter
	reforwarded    prometheus.Counter
	collected      prometheus.Counter
	// collectedHistory counts history records deleted after
	// buffer.history_retention.
	collectedHistory prometheus.Counter
	evicted          *prometheus.CounterVec
	refused          *prometheus.CounterVec
}

// newMetrics registers the buffer's metrics on reg (nil: a private
// registry).
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
		commitWait: f.NewHistogram(prometheus.HistogramOpts{
			Namespace: "gateway", Subsystem: "buffer", Name: "commit_wait_seconds",
			Help: "Time the committer waited for more commits before writing a group " +
				"(buffer.group_max_wait; 0 when the arrival rate did not call for a wait).",
			Buckets: prometheus.ExponentialBuckets(0.00001, 2, 14),
		}),
		delivered: f.NewCounter(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "buffer", Name: "delivered_batches_total",
			Help: "Batches removed from the queue after delivery.",
		}),
		deadLettered: f.NewCounter(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "buffer", Name: "dead_lettered_batches_total",
			Help: "Batches moved to the dead-letter area after a permanent cloud refusal.",
		}),
		reforwarded: f.NewCounter(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "buffer", Name: "reforwarded_batches_total",
			Help: "Dead-lettered batches an operator moved back into the queue.",
		}),
		collected: f.NewCounter(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "buffer", Name: "collected_markers_total",
			Help: "Delivery markers deleted after the retention window.",
		}),
		collectedHistory: f.NewCounter(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "buffer", Name: "collected_history_batches_total",
			Help: "Delivered batches deleted from the local history after buffer.history_retention.",
		}),
		evicted: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "buffer", Name: "evicted_batches_total",
			Help: "Batches evicted to keep the buffer within buffer.max_pending_bytes, by reason: " +
				"history_evicted (a delivered batch's payload kept for local queries, before buffer.history_retention ended), " +
				"marker_evicted (a delivered batch's marker, before its retention ended), " +
				"dropped_oldest (an undelivered batch, under buffer.full_policy drop_oldest).",
		}, []string{"reason"}),
		refused: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "buffer", Name: "refused_batches_total",
			Help: "New batches refused, by reason: budget (buffer.max_pending_bytes), " +
				"free_space (buffer.min_free_bytes), device_share (buffer.device_share), key_share " +
				"(buffer.key_share) or device_rate (buffer.device_batch_rate).",
		}, []string{"reason"}),
	}
	for _, o := range []Outcome{Stored, Duplicate, Conflict, Full, Limited} {
		m.outcomes.WithLabelValues(o.String())
	}
	for _, r := range []string{reasonHistoryEvicted, reasonMarkerEvicted, reasonDroppedOldest} {
		m.evicted.WithLabelValues(r)
	}
	for _, r := range []string{refusedBudget, refusedFreeSpace, refusedDeviceShare, refusedKeyShare, refusedDeviceRate} {
		m.refused.WithLabelValues(r)
	}
	registerGauges(f, b)
	return m
}

// registerGauges registers the gauges read from the buffer's state at
// each scrape: the queue, the budget's use by kind, free disk space.
func registerGauges(f promauto.Factory, b *Buffer) {
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
	used := func(kind string, v func() int64) {
		f.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "gateway", Subsystem: "buffer", Name: "used_bytes",
			Help:        "What the disk budget (buffer.max_pending_bytes) counts, by kind: pending, delivered (markers), dead (letters), state, history (delivered payloads kept for local queries).",
			ConstLabels: prometheus.Labels{"kind": kind},
		}, func() float64 { return float64(v()) })
	}
	used("pending", b.usage.pending.Load)
	used("delivered", b.usage.delivered.Load)
	used("dead", b.usage.dead.Load)
	used("state", b.usage.state.Load)
	used("history", b.usage.history.Load)
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "gateway", Subsystem: "buffer", Name: "history_batches",
		Help: "Delivered batches whose payloads are kept for local queries (buffer.history_retention).",
	}, func() float64 { return float64(b.usage.historyBatches.Load()) })
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "gateway", Subsystem: "buffer", Name: "budget_bytes",
		Help: "The disk budget, buffer.max_pending_bytes.",
	}, func() float64 { return float64(b.opts.MaxPendingBytes) })
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "gateway", Subsystem: "buffer", Name: "delivered_markers",
		Help: "Delivered batches whose markers are kept to answer duplicates.",
	}, func() float64 { return float64(b.usage.deliveredMarkers.Load()) })
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "gateway", Subsystem: "buffer", Name: "disk_free_bytes",
		Help: "Free bytes of the data directory's file system; below buffer.min_free_bytes new batches are refused.",
	}, func() float64 {
		free, _ := b.free.bytes()
		return float64(free)
	})
}
