package buffer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/stretchr/testify/require"
)

// TestReclaimSpaceFreesDeletedRecords: on a disk under the watermark, the
// delivered batches' records leave the tables once reclaimSpace has run,
// though too few deletions were made to fill a memtable.
func TestReclaimSpaceFreesDeletedRecords(t *testing.T) {
	free := uint64(1 << 40)
	// No background compactions: one would drop the deleted records
	// before reclaimSpace could show that it does.
	opts := Options{MemTableSize: 1 << 20, MinFreeBytes: RequiredFreeBytes(1 << 20), HistoryRetention: -time.Second,
		freeBytes: func() (uint64, bool) { return free, true }, tuneBadger: func(o *badger.Options) { o.NumCompactors = 0 }}
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

// TestReclaimSpaceWaitsForDeletions refuses batches with nothing delivered
// since the last reclaim (an uplink down while the disk fills): compacting
// then would only rewrite every table, taking their size again from the
// disk. reclaimSpace leaves the tables alone until the uplink's deletions
// come, and then reclaims at once, not a reclaimInterval after the
// useless compaction.
func TestReclaimSpaceWaitsForDeletions(t *testing.T) {
	free := uint64(1 << 40)
	opts := Options{MemTableSize: 1 << 20, MinFreeBytes: RequiredFreeBytes(1 << 20), HistoryRetention: -time.Second,
		freeBytes: func() (uint64, bool) { return free, true }, tuneBadger: func(o *badger.Options) { o.NumCompactors = 0 }}
	b := open(t, t.TempDir(), opts)
	tables := func() []string {
		files, err := filepath.Glob(filepath.Join(b.dir, "*.sst"))
		require.NoError(t, err)
		return files
	}
	refuse := func() {
		free = 1 << 20
		out, err := b.Commit(context.Background(), []Entry{entry("refused", "x")})
		require.NoError(t, err)
		require.Equal(t, []Outcome{Full}, out)
		free = 1 << 40
	}
	payload := make([]byte, 4<<10)
	for i := range 1200 {
		for k := range payload {
			payload[k] = byte(rand.IntN(256))
		}
		_, err := b.Commit(context.Background(), []Entry{entry(fmt.Sprintf("b%04d", i), string(payload))})
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return len(tables()) >= 3 }, 30*time.Second, 100*time.Millisecond)
	// A first reclaim after opening is tried (the tables may hold what an
	// earlier run deleted); it compacts the tables into new ones.
	refuse()
	b.reclaimSpace(time.Now())
	require.NotZero(t, b.reclaim.last, "the first reclaim ran")
	compacted := tables()
	require.NotEmpty(t, compacted)

	// Refused again, past the interval, with nothing deleted: the tables
	// stay as they are.
	b.reclaim.last = time.Now().Add(-2 * reclaimInterval)
	last := b.reclaim.last
	refuse()
	b.reclaimSpace(time.Now())
	require.Equal(t, last, b.reclaim.last, "no reclaim without deletions")
	require.Equal(t, compacted, tables(), "no compaction without deletions")

	// The uplink delivers: the next look reclaims.
	pending, err := b.Pending(0, 2000)
	require.NoError(t, err)
	require.NoError(t, b.MarkDelivered(pending))
	refuse()
	b.reclaimSpace(time.Now())
	require.NotEqual(t, last, b.reclaim.last, "a reclaim once records were deleted")
	require.Eventually(t, func() bool { return !slices.Equal(compacted, tables()) }, 10*time.Second, 100*time.Millisecond,
		"the deleted records are compacted away")
}
