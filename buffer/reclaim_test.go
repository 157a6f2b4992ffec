package buffer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestReclaimSpaceFreesDeletedRecords: on a disk under the watermark, the
// delivered batches' records leave the tables once reclaimSpace has run,
// though too few deletions were made to fill a memtable.
func TestReclaimSpaceFreesDeletedRecords(t *testing.T) {
	free := uint64(1 << 40)
	opts := Options{MemTableSize: 1 << 20, MinFreeBytes: RequiredFreeBytes(1 << 20), HistoryRetention: -time.Second,
		freeBytes: func() (uint64, bool) { return free, true }}
	b := open(t, t.TempDir(), opts)
	payload := make([]byte, 4<<10)
	for i := range 1200 { // about 5 MiB: several memtables flushed to tables
		for k := range payload {
			payload[k] = byte(rand.IntN(256))
		}
		_, err := b.Commit(context.Background(), []Entry{entry(fmt.Sprintf("b%04d", i), string(payload))})
		require.NoError(t, err)
	}
	pending, err := b.Pending(0, 2000)
	require.NoError(t, err)
	require.NoError(t, b.MarkDelivered(pending))
	lsm := func() int64 { // the tables' bytes on disk
		files, err := filepath.Glob(filepath.Join(b.dir, "*.sst"))
		require.NoError(t, err)
		var n int64
		for _, f := range files {
			if fi, err := os.Stat(f); err == nil {
				n += fi.Size()
			}
		}
		return n
	}
	// Memtables are flushed in the background: wait until the tables hold
	// the payloads and stop growing.
	var before int64
	require.Eventually(t, func() bool {
		n := lsm()
		settled := n == before
		before = n
		return settled && n > 4<<20
	}, 30*time.Second, 200*time.Millisecond, "the payloads are in the tables")

	b.reclaimSpace(time.Now())
	require.Equal(t, before, lsm(), "nothing happens while batches are not refused")

	free = 1 << 20 // under the watermark: the next batch is refused
	out, err := b.Commit(context.Background(), []Entry{entry("refused", "x")})
	require.NoError(t, err)
	require.Equal(t, []Outcome{Full}, out)
	b.reclaimSpace(time.Now())
	require.Eventually(t, func() bool { return lsm() < before/4 }, 10*time.Second, 100*time.Millisecond,
		"the deleted payloads left the tables: %d bytes, %d before", lsm(), before)
}
