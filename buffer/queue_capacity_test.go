package buffer

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/harness/syncbuf"
)

// cost is what the budget counts for e while it is pending.
func cost(e Entry) int64 {
	return pendingCost(len(e.BatchID), len(encodePending(Pending{BatchID: e.BatchID, HardwareID: e.HardwareID,
		ReceivedAt: e.ReceivedAt, Payload: e.Payload})))
}

// clockOptions returns opts with a settable clock.
func clockOptions(opts Options, now *time.Time) Options {
	opts.now = func() time.Time { return *now }
	return opts
}

func commit(tb testing.TB, b *Buffer, entries ...Entry) []Outcome {
	tb.Helper()
	out, err := b.Commit(context.Background(), entries)
	require.NoError(tb, err)
	return out
}

// deliver commits the entries and marks them delivered, one at a time, the
// clock advancing a second each, so their markers age in order.
func deliver(tb testing.TB, b *Buffer, now *time.Time, entries ...Entry) {
	tb.Helper()
	for _, e := range entries {
		require.Equal(tb, []Outcome{Stored}, commit(tb, b, e))
		pend, err := b.Pending(0, 1000)
		require.NoError(tb, err)
		var p []Pending
		for _, q := range pend {
			if q.BatchID == e.BatchID {
				p = append(p, q)
			}
		}
		require.Len(tb, p, 1)
		require.NoError(tb, b.MarkDelivered(p))
		*now = now.Add(time.Second)
	}
}

func state(tb testing.TB, b *Buffer, id string) string {
	tb.Helper()
	s, err := b.Lookup(id)
	if err != nil {
		require.ErrorIs(tb, err, ErrNotFound)
		return "gone"
	}
	return s
}

func pendingIDs(tb testing.TB, b *Buffer) []string {
	tb.Helper()
	pend, err := b.Pending(0, 10_000)
	require.NoError(tb, err)
	var ids []string
	for _, p := range pend {
		ids = append(ids, p.BatchID)
	}
	return ids
}

// requireUsageMatchesDisk checks the counters kept on every write against a
// full scan of the records.
func requireUsageMatchesDisk(tb testing.TB, b *Buffer) {
	tb.Helper()
	s, err := b.scan()
	require.NoError(tb, err)
	require.Equal(tb, s.usage, b.Usage(), "usage")
	require.Equal(tb, s.pendingBatches, b.Stats().PendingBatches, "pending batches")
	require.Equal(tb, s.pendingBytes, b.Stats().PendingBytes, "pending bytes")
}

func TestDeliveredMarkersAreEvictedOldestFirstUnderBothPolicies(t *testing.T) {
	for _, policy := range []string{PolicyRejectNew, PolicyDropOldest} {
		t.Run(policy, func(t *testing.T) {
			now := time.UnixMilli(1_700_000_000_000)
			m1, m2, m3 := entry("m1", "delivered 1"), entry("m2", "delivered 2"), entry("m3", "delivered 3")
			p1, n1 := entry("p1", "pending 1"), entry("n1", "new 1")
			marker := deliveredCost(2)
			// Room for three delivered markers and one pending batch; a
			// second pending batch needs the space of one marker or more.
			budget := 3*marker + cost(p1) + cost(n1) - marker
			reg := prometheus.NewRegistry()
			b, err := Open(t.TempDir(), clockOptions(Options{MaxPendingBytes: budget, FullPolicy: policy}, &now), nil, reg)
			require.NoError(t, err)
			t.Cleanup(func() { _ = b.Close() })

			deliver(t, b, &now, m1, m2, m3)
			require.Equal(t, 3*marker, b.Usage().Delivered, "delivered markers count towards the budget")
			require.Equal(t, []Outcome{Stored}, commit(t, b, p1))
			require.Equal(t, []Outcome{Stored}, commit(t, b, n1), "room is made by evicting markers")

			require.Equal(t, "gone", state(t, b, "m1"), "the oldest marker goes first")
			require.Equal(t, "delivered", state(t, b, "m2"))
			require.Equal(t, "delivered", state(t, b, "m3"))
			require.Equal(t, []string{"p1", "n1"}, pendingIDs(t, b), "no undelivered batch is dropped while markers remain")
			require.Equal(t, 1.0, testutil.ToFloat64(b.metrics.evicted.WithLabelValues(reasonMarkerEvicted)))
			require.Zero(t, testutil.ToFloat64(b.metrics.evicted.WithLabelValues(reasonDroppedOldest)))
			require.LessOrEqual(t, b.Stats().UsedBytes, budget)
			require.Equal(t, []Outcome{Duplicate}, commit(t, b, m2), "a kept marker still answers duplicate")
			requireUsageMatchesDisk(t, b)
		})
	}
}

func TestRejectNewRefusesOnceNoMarkerIsLeft(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	m1, p1, p2, p3 := entry("m1", "delivered"), entry("p1", "one"), entry("p2", "two"), entry("p3", "three")
	budget := cost(p1) + cost(p2) + deliveredCost(2)/2
	reg := prometheus.NewRegistry()
	b, err := Open(t.TempDir(), clockOptions(Options{MaxPendingBytes: budget}, &now), nil, reg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	deliver(t, b, &now, m1)

	require.Equal(t, []Outcome{Stored, Stored, Full}, commit(t, b, p1, p2, p3),
		"the marker makes room for p2; p3 finds none")
	require.Equal(t, "gone", state(t, b, "m1"))
	require.Equal(t, "gone", state(t, b, "p3"), "a refused batch leaves no marker")
	require.Equal(t, []Outcome{Full}, commit(t, b, p3), "still full: undelivered batches are never dropped")
	require.Equal(t, []string{"p1", "p2"}, pendingIDs(t, b))
	require.Equal(t, 2.0, testutil.ToFloat64(b.metrics.refused.WithLabelValues(refusedBudget)))
	require.Equal(t, 2.0, testutil.ToFloat64(b.metrics.outcomes.WithLabelValues("full")))

	// Delivery frees the budget.
	pend, err := b.Pending(0, 10)
	require.NoError(t, err)
	require.NoError(t, b.MarkDelivered(pend[:1]))
	require.Equal(t, []Outcome{Stored}, commit(t, b, p3), "p1's payload is gone; its marker is evicted if need be")
	requireUsageMatchesDisk(t, b)
}

func TestDropOldestDropsUndeliveredBatchesOldestFirst(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	m1 := entry("m1", "delivered")
	p1, p2, p3, p4 := entry("p1", "one"), entry("p2", "two"), entry("p3", "three"), entry("p4", "four")
	budget := deliveredCost(2) + cost(p1) + cost(p2) + cost(p3)
	reg := prometheus.NewRegistry()
	var logs syncbuf.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	b, err := Open(t.TempDir(), clockOptions(Options{MaxPendingBytes: budget, FullPolicy: PolicyDropOldest}, &now), logger, reg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	deliver(t, b, &now, m1)
	require.Equal(t, []Outcome{Stored, Stored, Stored}, commit(t, b, p1, p2, p3))
	lease, err := b.Pending(0, 10) // the uplink holds p1..p3
	require.NoError(t, err)

	// p4 needs more than the marker: the marker goes first, then p1.
	require.Equal(t, []Outcome{Stored}, commit(t, b, p4))
	require.Equal(t, "gone", state(t, b, "m1"))
	require.Equal(t, "gone", state(t, b, "p1"), "the oldest undelivered batch is dropped")
	require.Equal(t, []string{"p2", "p3", "p4"}, pendingIDs(t, b))
	require.Equal(t, 1.0, testutil.ToFloat64(b.metrics.evicted.WithLabelValues(reasonMarkerEvicted)))
	require.Equal(t, 1.0, testutil.ToFloat64(b.metrics.evicted.WithLabelValues(reasonDroppedOldest)))
	require.Contains(t, logs.String(), `level=WARN msg="oldest undelivered batches dropped to make room (buffer.full_policy drop_oldest)" component=buffer dropped=1`)
	require.Contains(t, logs.String(), "first_batch_id=p1")
	require.Contains(t, logs.String(), `level=INFO msg="delivered markers evicted to make room`)
	require.EqualValues(t, 3, b.Stats().PendingBatches)
	requireUsageMatchesDisk(t, b)

	// The uplink delivers its lease, p1 included: the dropped batch is
	// skipped, the others are marked.
	require.NoError(t, b.MarkDelivered(lease))
	require.Equal(t, "gone", state(t, b, "p1"))
	require.Equal(t, "delivered", state(t, b, "p2"))
	require.Equal(t, []string{"p4"}, pendingIDs(t, b))
	requireUsageMatchesDisk(t, b)
}

func TestDropOldestNeverDropsForABatchThatCannotFit(t *testing.T) {
	p1 := entry("p1", "one")
	huge := entry("huge", string(make([]byte, 4096)))
	b := open(t, t.TempDir(), Options{MaxPendingBytes: 2 * cost(p1), FullPolicy: PolicyDropOldest})
	require.Equal(t, []Outcome{Stored}, commit(t, b, p1))
	require.Equal(t, []Outcome{Full}, commit(t, b, huge))
	require.Equal(t, []string{"p1"}, pendingIDs(t, b), "nothing is dropped for a batch larger than the budget")
}

func TestDeadLettersCountButAreNeverEvicted(t *testing.T) {
	p1, p2 := entry("p1", "one"), entry("p2", "two")
	dead := deadRecord(2, len(encodeDead(Pending{BatchID: "p1", HardwareID: p1.HardwareID,
		ReceivedAt: p1.ReceivedAt, Payload: p1.Payload}, "ValidationException"))) + markerRecord(2)
	b := open(t, t.TempDir(), Options{MaxPendingBytes: dead + cost(p2) - 1, FullPolicy: PolicyDropOldest})
	require.Equal(t, []Outcome{Stored}, commit(t, b, p1))
	pend, err := b.Pending(0, 1)
	require.NoError(t, err)
	require.NoError(t, b.DeadLetter(pend[0], "ValidationException"))
	require.Equal(t, dead, b.Usage().Dead)
	require.Equal(t, []Outcome{Full}, commit(t, b, p2), "the dead letter is kept even under drop_oldest")
	require.Equal(t, "dead", state(t, b, "p1"))
	requireUsageMatchesDisk(t, b)
}

func TestFreeSpaceWatermarkRefusesUnderBothPolicies(t *testing.T) {
	for _, policy := range []string{PolicyRejectNew, PolicyDropOldest} {
		t.Run(policy, func(t *testing.T) {
			free := uint64(1 << 40)
			opts := Options{FullPolicy: policy}
			opts.freeBytes = func() (uint64, bool) { return free, true }
			b := open(t, t.TempDir(), opts)
			require.Equal(t, []Outcome{Stored}, commit(t, b, entry("p1", "one")))
			free = uint64(b.opts.MinFreeBytes) - 1
			require.Equal(t, []Outcome{Full, Duplicate}, commit(t, b, entry("p2", "two"), entry("p1", "one")),
				"below the watermark nothing new is stored, duplicates are still answered")
			require.Equal(t, []string{"p1"}, pendingIDs(t, b), "deleting does not free disk space in time: nothing is dropped")
			require.Equal(t, 1.0, testutil.ToFloat64(b.metrics.refused.WithLabelValues(refusedFreeSpace)))
			free = uint64(b.opts.MinFreeBytes)
			require.Equal(t, []Outcome{Stored}, commit(t, b, entry("p2", "two")), "ingest resumes once space is back")
		})
	}
}

func TestRepeatedBatchInAGroupFollowsItsFirstCopy(t *testing.T) {
	a := entry("a", string(make([]byte, 100)))
	b := open(t, t.TempDir(), Options{MaxPendingBytes: cost(a) - 1})
	require.Equal(t, []Outcome{Full, Full}, commit(t, b, a, a), "a copy of a refused batch is refused too")
}

func TestUsageIsKeptAcrossEveryWriteAndRestart(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	dir := t.TempDir()
	opts := clockOptions(Options{Retention: time.Hour, FullPolicy: PolicyDropOldest}, &now)
	b, err := Open(dir, opts, nil, nil)
	require.NoError(t, err)
	var batch []Entry
	for i := range 40 {
		batch = append(batch, entry(fmt.Sprintf("batch-%02d", i), fmt.Sprintf("payload %d", i)))
	}
	commit(t, b, batch...)
	pend, err := b.Pending(0, 100)
	require.NoError(t, err)
	require.NoError(t, b.MarkDelivered(pend[:10]))
	require.NoError(t, b.DeadLetter(pend[10], "ValidationException"))
	require.NoError(t, b.SaveState("dev/A", []byte("first")))
	require.NoError(t, b.SaveState("dev/A", []byte("second, longer")))
	require.NoError(t, b.SaveState("dev/B", []byte("b")))
	requireUsageMatchesDisk(t, b)
	now = now.Add(2 * time.Hour)
	require.NoError(t, b.MarkDelivered(pend[11:15]))
	n, err := b.Collect()
	require.NoError(t, err)
	require.Equal(t, 10, n)
	requireUsageMatchesDisk(t, b)

	// Shrink the budget so that the next commit evicts and drops.
	before := b.Usage()
	require.NoError(t, b.Close())
	opts.MaxPendingBytes = before.Total()
	b = open(t, dir, opts)
	require.Equal(t, before, b.Usage(), "a restart counts the same")
	require.Equal(t, []Outcome{Stored}, commit(t, b, entry("new-1", string(make([]byte, 1000)))))
	require.Equal(t, 4.0, testutil.ToFloat64(b.metrics.evicted.WithLabelValues(reasonMarkerEvicted)),
		"every delivered marker goes before any undelivered batch")
	require.Positive(t, testutil.ToFloat64(b.metrics.evicted.WithLabelValues(reasonDroppedOldest)))
	require.Equal(t, "gone", state(t, b, "batch-15"), "the oldest undelivered batch is dropped")
	require.LessOrEqual(t, b.Stats().UsedBytes, opts.MaxPendingBytes)
	requireUsageMatchesDisk(t, b)
}
