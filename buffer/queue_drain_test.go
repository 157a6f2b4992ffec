package buffer

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPendingAfterDeliveriesStartsAtTheOldestQueued(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	dir := t.TempDir()
	b := open(t, dir, clockOptions(Options{}, &now))
	var all []Entry
	for i := range 10 {
		all = append(all, batchEntry(hwA, fmt.Sprintf("q%d", i), int64(1000*(i+1))))
	}
	commit(t, b, all...)
	pend, err := b.Pending(0, 4)
	require.NoError(t, err)
	require.NoError(t, b.MarkDelivered(pend))

	for _, tc := range []struct {
		name  string
		after uint64
		want  []string
	}{
		{"from the start", 0, []string{"q4", "q5", "q6", "q7", "q8", "q9"}},
		{"after a delivered entry", 2, []string{"q4", "q5", "q6", "q7", "q8", "q9"}},
		{"after a queued entry", 6, []string{"q6", "q7", "q8", "q9"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pend, err := b.Pending(tc.after, 100)
			require.NoError(t, err)
			var ids []string
			for _, p := range pend {
				ids = append(ids, p.BatchID)
			}
			require.Equal(t, tc.want, ids)
			refs, err := b.PendingRefs(tc.after, 100)
			require.NoError(t, err)
			require.Len(t, refs, len(tc.want))
		})
	}
	require.Equal(t, time.UnixMilli(1_700_000_000_000), b.Stats().Oldest)

	// A dead letter forwarded again is queued behind everything, and new
	// batches after it.
	require.NoError(t, b.DeadLetter(pend[0], "refused"))
	rest, err := b.Pending(0, 100)
	require.NoError(t, err)
	require.NoError(t, b.DeadLetter(rest[0], "refused"))
	_, err = b.Reforward(rest[0].BatchID)
	require.NoError(t, err)
	commit(t, b, batchEntry(hwB, "late", 99_000))
	require.Equal(t, []string{"q5", "q6", "q7", "q8", "q9", "q4", "late"}, pendingIDs(t, b))

	// After a restart too.
	require.NoError(t, b.Close())
	b = open(t, dir, clockOptions(Options{}, &now))
	require.Equal(t, []string{"q5", "q6", "q7", "q8", "q9", "q4", "late"}, pendingIDs(t, b))
	requireUsageMatchesDisk(t, b)
}

func TestMarkDeliveredWithTheReadingTimesKeepsTheSameHistory(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	b := open(t, t.TempDir(), clockOptions(Options{HistoryRetention: time.Hour}, &now))
	commit(t, b,
		batchEntry(hwA, "known", 5000, 3000, 4000),
		batchEntry(hwA, "parsed", 7000, 6000),
		batchEntry(hwA, "mismatch", 9000, 8000))
	pend, err := b.Pending(0, 10)
	require.NoError(t, err)
	require.Len(t, pend, 3)
	// The uplink passes the times it decoded; without them the buffer
	// reads them from the payload; a payload that is not the queued one
	// (a different size) is not trusted.
	pend[0].FirstMS, pend[0].LastMS, pend[0].SpanKnown = 3000, 5000, true
	pend[2].FirstMS, pend[2].LastMS, pend[2].SpanKnown = 1, 2, true
	pend[2].Payload = pend[2].Payload[:10]
	require.NoError(t, b.MarkDelivered(pend))

	// found checks each record's span against its payload.
	require.Equal(t, []string{"known delivered", "parsed delivered", "mismatch delivered"}, found(t, b, hwA, 0, 10_000))
	require.NoError(t, b.DeviceBatches(hwA, 0, 10_000, func(d DeviceBatch) error {
		require.Greater(t, len(d.Payload), 10, "the queued payload is kept, not the caller's")
		return nil
	}))
	require.Equal(t, int64(3), b.Usage().HistoryBatches)
	requireUsageMatchesDisk(t, b)
}
