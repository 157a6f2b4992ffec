package buffer

import (
	"fmt"
	"strings"
	"testing"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/stretchr/testify/require"
)

// TestParallelScanCountsAsOnePass fills a buffer with every kind of record
// over many tables and checks that the scan cut into ranges (what Open
// uses) counts exactly what one pass over all keys counts.
func TestParallelScanCountsAsOnePass(t *testing.T) {
	dir := t.TempDir()
	b := open(t, dir, Options{MemTableSize: 1 << 20, HistoryRetention: 1 << 40})
	pad := strings.Repeat("x", 900)
	for i := range 3000 {
		e := batchEntry(fmt.Sprintf("AA:BB:CC:DD:%02X:%02X", i%7, i%5), fmt.Sprintf("batch-%05d", i), int64(1000+i))
		e.Payload = append(e.Payload[:len(e.Payload)-1], []byte(`,"pad":"`+pad+`"}`)...)
		require.Equal(t, []Outcome{Stored}, commit(t, b, e))
	}
	pend, err := b.Pending(0, 1200)
	require.NoError(t, err)
	require.NoError(t, b.MarkDelivered(pend[:1000]))
	for _, p := range pend[1000:1010] {
		require.NoError(t, b.DeadLetter(p, "ValidationException"))
	}
	require.NoError(t, b.SaveStates(map[string][]byte{"device/a": []byte("1"), "device/b": []byte("2")}))
	require.NoError(t, b.db.Flatten(1))

	bounds := scanBounds(b.db, 8)
	require.NotEmpty(t, bounds, "the store has %d tables: the scan must be cut into ranges", len(b.db.Tables()))
	for i := 1; i < len(bounds); i++ {
		require.Less(t, string(bounds[i-1]), string(bounds[i]))
	}

	got, err := scanDB(b.db)
	require.NoError(t, err)
	txn := b.db.NewTransaction(false)
	defer txn.Discard()
	want, err := scanRange(txn, nil, nil)
	require.NoError(t, err)
	want.nextSeq = max(want.nextSeq, want.storedSeq, 1)
	require.Equal(t, want, got)
	require.EqualValues(t, 3000-1010, got.pendingBatches)
	require.EqualValues(t, 1000, got.usage.HistoryBatches)
	require.EqualValues(t, 10, got.usage.DeadBatches)
	require.EqualValues(t, 3001, got.nextSeq)

	// A malformed record is reported whichever range holds it.
	require.NoError(t, b.db.Update(func(txn *badger.Txn) error { return txn.Set([]byte("zz/unknown"), []byte("1")) }))
	_, err = scanDB(b.db)
	require.ErrorContains(t, err, `unknown record "zz/unknown"`)
}
