package buffer

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

const (
	hwA = "AA:BB:CC:DD:EE:01"
	hwB = "AA:BB:CC:DD:EE:02"
)

// batchEntry is an entry whose payload is a batch with one reading at each
// timestamp.
func batchEntry(hw, id string, timestamps ...int64) Entry {
	var readings []map[string]any
	for _, ts := range timestamps {
		readings = append(readings, map[string]any{"timestamp_ms": ts, "sensors": map[string]float64{"temp_c": 21.5}})
	}
	payload, _ := json.Marshal(map[string]any{"batch_id": id, "hardware_id": hw, "readings": readings})
	return Entry{BatchID: id, HardwareID: hw, Hash: sha256.Sum256(payload), Payload: payload,
		ReceivedAt: time.UnixMilli(1_700_000_000_000)}
}

// found is what DeviceBatches reports, in order: batch_id and whether it
// was delivered.
func found(tb testing.TB, b *Buffer, hw string, from, to int64) []string {
	tb.Helper()
	var out []string
	require.NoError(tb, b.DeviceBatches(hw, from, to, func(d DeviceBatch) error {
		require.Equal(tb, hw, d.HardwareID)
		first, last, err := readingSpan(d.Payload)
		require.NoError(tb, err)
		require.Equal(tb, []int64{first, last}, []int64{d.FirstMS, d.LastMS})
		state := "pending"
		if d.Delivered {
			state = "delivered"
		}
		out = append(out, d.BatchID+" "+state)
		return nil
	}))
	return out
}

func TestHistoryKeepsDeliveredPayloadsByDeviceAndWindow(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	dir := t.TempDir()
	opts := clockOptions(Options{HistoryRetention: time.Hour}, &now)
	b, err := Open(dir, opts, nil, nil)
	require.NoError(t, err)
	a1 := batchEntry(hwA, "a1", 1000, 2000, 3000)
	a2 := batchEntry(hwA, "a2", 5000, 4000) // readings out of order
	b1 := batchEntry(hwB, "b1", 1500)
	a3 := batchEntry(hwA, "a3", 9000)
	deliver(t, b, &now, a1, b1, a2)
	commit(t, b, a3)
	require.Equal(t, "delivered", state(t, b, "a1"))
	require.EqualValues(t, 3, b.Usage().HistoryBatches)
	requireUsageMatchesDisk(t, b)

	tests := []struct {
		name     string
		hw       string
		from, to int64
		want     []string
	}{
		{"everything of a device", hwA, 0, 10_000, []string{"a1 delivered", "a2 delivered", "a3 pending"}},
		{"other device", hwB, 0, 10_000, []string{"b1 delivered"}},
		{"window inside a batch's span", hwA, 2500, 2600, []string{"a1 delivered"}},
		{"from is inclusive", hwA, 3000, 3001, []string{"a1 delivered"}},
		{"to is exclusive", hwA, 0, 1000, nil},
		{"first reading is not the lowest", hwA, 4000, 4001, []string{"a2 delivered"}},
		{"pending only", hwA, 8000, 9001, []string{"a3 pending"}},
		{"unknown device", "AA:BB:CC:DD:EE:99", 0, 10_000, nil},
		{"empty window", hwA, 5000, 5000, nil},
	}
	check := func(t *testing.T, b *Buffer) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				require.Equal(t, tt.want, found(t, b, tt.hw, tt.from, tt.to))
			})
		}
	}
	check(t, b)

	// The history survives a restart, counted the same.
	before := b.Usage()
	require.NoError(t, b.Close())
	b = open(t, dir, opts)
	require.Equal(t, before, b.Usage())
	t.Run("after reopen", func(t *testing.T) { check(t, b) })

	// A resend of a delivered batch is still a duplicate; the marker
	// outlives the history.
	require.Equal(t, []Outcome{Duplicate}, commit(t, b, a1))

	// Collected once delivered more than HistoryRetention ago: a1 was
	// delivered first, a2 two seconds later.
	now = time.UnixMilli(1_700_000_000_000).Add(time.Hour + 500*time.Millisecond)
	n, err := b.CollectHistory()
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, []string{"a2 delivered", "a3 pending"}, found(t, b, hwA, 0, 10_000))
	now = now.Add(time.Hour)
	n, err = b.CollectHistory()
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, []string{"a3 pending"}, found(t, b, hwA, 0, 10_000))
	require.Zero(t, b.Usage().History)
	require.Equal(t, 3.0, testutil.ToFloat64(b.metrics.collectedHistory))
	require.Equal(t, "delivered", state(t, b, "a1"), "markers keep their own retention")
	requireUsageMatchesDisk(t, b)
}

func TestHistoryIsEvictedBeforeDeliveredMarkers(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	dir := t.TempDir()
	opts := clockOptions(Options{}, &now)
	b, err := Open(dir, opts, nil, nil)
	require.NoError(t, err)
	var delivered []Entry
	for i := range 6 {
		delivered = append(delivered, batchEntry(hwA, fmt.Sprintf("old-%d", i), int64(1000*(i+1))))
	}
	deliver(t, b, &now, delivered...)
	u := b.Usage()
	require.EqualValues(t, 6, u.HistoryBatches)
	require.NoError(t, b.Close())

	// A budget with room for one more batch once two history records go.
	next := batchEntry(hwA, "new", 99_000)
	perHistory := u.History / 6
	opts.MaxPendingBytes = u.Total() + cost(next) - 2*perHistory + perHistory/2
	b = open(t, dir, opts)
	require.Equal(t, []Outcome{Stored}, commit(t, b, next))
	require.Equal(t, 2.0, testutil.ToFloat64(b.metrics.evicted.WithLabelValues(reasonHistoryEvicted)))
	require.Zero(t, testutil.ToFloat64(b.metrics.evicted.WithLabelValues(reasonMarkerEvicted)))
	require.Equal(t, []string{"old-2 delivered", "old-3 delivered", "old-4 delivered", "old-5 delivered", "new pending"},
		found(t, b, hwA, 0, 100_000), "the oldest deliveries go first")
	for _, e := range delivered {
		require.Equal(t, "delivered", state(t, b, e.BatchID), "every marker is kept")
	}
	require.LessOrEqual(t, b.Usage().Total(), opts.MaxPendingBytes)
	requireUsageMatchesDisk(t, b)

	// With no history left, markers go next.
	opts.MaxPendingBytes = b.Usage().Total() - b.Usage().History
	require.NoError(t, b.Close())
	b = open(t, dir, opts)
	require.Equal(t, []Outcome{Stored}, commit(t, b, batchEntry(hwA, "newer", 99_500)))
	require.Equal(t, 4.0, testutil.ToFloat64(b.metrics.evicted.WithLabelValues(reasonHistoryEvicted)))
	require.Positive(t, testutil.ToFloat64(b.metrics.evicted.WithLabelValues(reasonMarkerEvicted)))
	require.Zero(t, b.Usage().HistoryBatches)
	requireUsageMatchesDisk(t, b)
}

func TestHistoryOff(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	dir := t.TempDir()
	b, err := Open(dir, clockOptions(Options{}, &now), nil, nil)
	require.NoError(t, err)
	deliver(t, b, &now, batchEntry(hwA, "kept", 1000))
	require.EqualValues(t, 1, b.Usage().HistoryBatches)
	require.NoError(t, b.Close())

	b = open(t, dir, clockOptions(Options{HistoryRetention: -time.Second}, &now))
	deliver(t, b, &now, batchEntry(hwA, "not-kept", 2000))
	require.Equal(t, []string{"kept delivered"}, found(t, b, hwA, 0, 10_000), "nothing new is kept")
	n, err := b.CollectHistory()
	require.NoError(t, err)
	require.Equal(t, 1, n, "what was kept goes at the next collection")
	require.Empty(t, found(t, b, hwA, 0, 10_000))
	require.Zero(t, b.Usage().History)
	requireUsageMatchesDisk(t, b)
}

func TestHistorySkipsPayloadsWithoutReadingTimes(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	b := open(t, t.TempDir(), clockOptions(Options{}, &now))
	deliver(t, b, &now, entry("opaque", "not a batch"))
	require.Equal(t, "delivered", state(t, b, "opaque"), "delivery does not depend on the history")
	require.Zero(t, b.Usage().HistoryBatches)
	requireUsageMatchesDisk(t, b)
}

// BenchmarkDeviceBatchesPendingScan measures one device's query over a
// queue of 20,000 pending batches of 10 readings from 100 devices, which
// DeviceBatches scans whole (the queue has no per-device index), and the
// same query served from the history alone.
func BenchmarkDeviceBatchesPendingScan(b *testing.B) {
	const devices, batches = 100, 20_000
	now := time.UnixMilli(1_700_000_000_000)
	buf := open(b, b.TempDir(), clockOptions(Options{}, &now))
	var all []Entry
	for i := range batches {
		hw := fmt.Sprintf("AA:BB:CC:DD:%02X:%02X", (i%devices)/256, i%devices)
		ts := make([]int64, 10)
		for j := range ts {
			ts[j] = 1_700_000_000_000 + int64(i*10+j)*1000
		}
		all = append(all, batchEntry(hw, fmt.Sprintf("%s_%d", hw, i), ts...))
	}
	for i := 0; i < len(all); i += 1000 {
		commit(b, buf, all[i:i+1000]...)
	}
	query := func(b *testing.B) {
		n := 0
		for b.Loop() {
			n = 0
			require.NoError(b, buf.DeviceBatches("AA:BB:CC:DD:00:07", 0, 1<<62, func(DeviceBatch) error { n++; return nil }))
		}
		require.Equal(b, batches/devices, n)
	}
	b.Run("pending", query)
	for {
		pend, err := buf.Pending(0, 1000)
		require.NoError(b, err)
		if len(pend) == 0 {
			break
		}
		require.NoError(b, buf.MarkDelivered(pend))
	}
	b.Run("history", query)
}

// BenchmarkMarkDeliveredHistory measures marking groups of 100 batches of
// 10 readings delivered with the history on (the payloads move to h/
// records in the same synced transaction) and off; "history_on_times_known"
// passes the reading times as the uplink does, which spares reading and
// decoding each queue entry again.
func BenchmarkMarkDeliveredHistory(b *testing.B) {
	for _, tc := range []struct {
		name      string
		retention time.Duration
		known     bool
	}{{"history_on", 0, false}, {"history_on_times_known", 0, true}, {"history_off", -time.Second, false}} {
		b.Run(tc.name, func(b *testing.B) {
			buf := open(b, b.TempDir(), Options{HistoryRetention: tc.retention})
			id := 0
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				var group []Entry
				for range 100 {
					ts := make([]int64, 10)
					for j := range ts {
						ts[j] = 1_700_000_000_000 + int64(id*10+j)*1000
					}
					group = append(group, batchEntry(hwA, fmt.Sprintf("batch-%d", id), ts...))
					id++
				}
				commit(b, buf, group...)
				pend, err := buf.Pending(0, 100)
				require.NoError(b, err)
				if tc.known {
					for i := range pend {
						pend[i].FirstMS, pend[i].LastMS, err = readingSpan(pend[i].Payload)
						require.NoError(b, err)
						pend[i].SpanKnown = true
					}
				}
				b.StartTimer()
				require.NoError(b, buf.MarkDelivered(pend))
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*100), "µs/batch")
		})
	}
}
