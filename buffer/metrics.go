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
	counter := func(name, help string) prometheus.Counter {
		return f.NewCounter(prometheus.CounterOpts{Namespace: "gateway", Subsystem: "buffer", Name: name, Help: help})
	}
	counterVec := func(name, help, label string) *prometheus.CounterVec {
		return f.NewCounterVec(prometheus.CounterOpts{Namespace: "gateway", Subsystem: "buffer", Name: name, Help: help},
			[]string{label})
	}
	histogram := func(name, help string, buckets []float64) prometheus.Histogram {
		return f.NewHistogram(prometheus.HistogramOpts{Namespace: "gateway", Subsystem: "buffer", Name: name, Help: help,
			Buckets: buckets})
	}
	m := &metrics{
		outcomes: counterVec("commit_batches_total",
			"Batches offered to the buffer, by outcome (stored, duplicate, conflict, full).", "outcome"),
		commitFailures: counter("commit_failures_total",
			"Group commits that failed; none of their batches were acknowledged."),
		groupBatches: histogram("commit_group_batches", "Batches per group commit (one fsync each).",
			prometheus.ExponentialBuckets(1, 2, 11)),
		commitSeconds: histogram("commit_duration_seconds", "Time to decide and durably write one commit group.",
			prometheus.ExponentialBuckets(0.0005, 2, 14)),
		commitWait: histogram("commit_wait_seconds",
			"Time the committer waited for more commits before writing a group "+
				"(buffer.group_max_wait; 0 when the arrival rate did not call for a wait).",
			prometheus.ExponentialBuckets(0.00001, 2, 14)),
		delivered:    counter("delivered_batches_total", "Batches removed from the queue after delivery."),
		deadLettered: counter("dead_lettered_batches_total", "Batches moved to the dead-letter area after a permanent cloud refusal."),
		reforwarded:  counter("reforwarded_batches_total", "Dead-lettered batches an operator moved back into the queue."),
		collected:    counter("collected_markers_total", "Delivery markers deleted after the retention window."),
		collectedHistory: counter("collected_history_batches_total",
			"Delivered batches deleted from the local history after buffer.history_retention."),
		evicted: counterVec("evicted_batches_total",
			"Batches evicted to keep the buffer within buffer.max_pending_bytes, by reason: "+
				"history_evicted (a delivered batch's payload kept for local queries, before buffer.history_retention ended), "+
				"marker_evicted (a delivered batch's marker, before its retention ended), "+
				"dropped_oldest (an undelivered batch, under buffer.full_policy drop_oldest).", "reason"),
		refused: counterVec("refused_batches_total",
			"New batches refused, by reason: budget (buffer.max_pending_bytes), "+
				"free_space (buffer.min_free_bytes), device_share (buffer.device_share), key_share "+
				"(buffer.key_share) or device_rate (buffer.device_batch_rate).", "reason"),
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
	gauge := func(name, help string, labels prometheus.Labels, v func() float64) {
		f.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "gateway", Subsystem: "buffer", Name: name, Help: help,
			ConstLabels: labels}, v)
	}
	count := func(v func() int64) func() float64 { return func() float64 { return float64(v()) } }
	gauge("pending_batches", "Batches stored and not yet delivered.", nil, count(b.pendingBatches.Load))
	gauge("pending_bytes", "Bytes of batches stored and not yet delivered.", nil, count(b.pendingBytes.Load))
	gauge("oldest_pending_age_seconds", "Age of the oldest undelivered batch; 0 when none is pending.", nil,
		func() float64 {
			s := b.Stats()
			if s.Oldest.IsZero() {
				return 0
			}
			return time.Since(s.Oldest).Seconds()
		})
	for kind, v := range map[string]func() int64{"pending": b.usage.pending.Load, "delivered": b.usage.delivered.Load,
		"dead": b.usage.dead.Load, "state": b.usage.state.Load, "history": b.usage.history.Load} {
		gauge("used_bytes", "What the disk budget (buffer.max_pending_bytes) counts, by kind: pending, delivered "+
			"(markers), dead (letters), state, history (delivered payloads kept for local queries).",
			prometheus.Labels{"kind": kind}, count(v))
	}
	gauge("history_batches", "Delivered batches whose payloads are kept for local queries (buffer.history_retention).",
		nil, count(b.usage.historyBatches.Load))
	gauge("budget_bytes", "The disk budget, buffer.max_pending_bytes.", nil,
		func() float64 { return float64(b.opts.MaxPendingBytes) })
	gauge("delivered_markers", "Delivered batches whose markers are kept to answer duplicates.", nil,
		count(b.usage.deliveredMarkers.Load))
	gauge("disk_free_bytes",
		"Free bytes of the data directory's file system; below buffer.min_free_bytes new batches are refused.", nil,
		func() float64 {
			free, _ := b.free.bytes()
			return float64(free)
		})
}
