package buffer

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/stretchr/testify/require"
)

// TestAMemtableThatCannotBeCreatedLeavesTheBufferReadable makes the data
// directory immutable (chattr +i: no file can be created in it, as on a card
// the kernel turned read-only, while the open files stay writable) as
// batches are committed, so that the next memtable rotation cannot create
// its write-ahead log. The commit that meets it fails, the buffer is
// failed, Badger can still be read (the uplink's scans race gatewayd's
// stop), and once the directory is writable again every batch
// acknowledged before is there. Upstream Badger handed the full memtable to
// the flusher before it made the next one, so a rotation that could not
// create its file left no mutable memtable, and the next read dereferenced
// it (a nil pointer panic in getMemTables). cmd/gatewayd's
// TestFileCreationFailuresStopCleanly fails each kind of file through the
// fault-injecting file system, against gatewayd.
func TestAMemtableThatCannotBeCreatedLeavesTheBufferReadable(t *testing.T) {
	dir := t.TempDir()
	opts := Options{MemTableSize: 1 << 20}
	b, err := Open(dir, opts, nil, nil)
	require.NoError(t, err)
	if out, err := exec.Command("chattr", "+i", dir).CombinedOutput(); err != nil {
		_ = b.Close()
		t.Skipf("chattr +i needs root and an ext4-like file system: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("chattr", "-i", dir).Run() })
	acked := 0
	var commitErr error
	// 2 KB batches: a 1 MiB memtable rotates after a few hundred.
	for i := 0; i < 5_000 && commitErr == nil; i++ {
		p := incompressible(i)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, commitErr = b.Commit(ctx, []Entry{{BatchID: fmt.Sprintf("batch-%05d", i), HardwareID: "AA:BB:CC:DD:EE:FF",
			Hash: sha256.Sum256(p), Payload: p, ReceivedAt: time.UnixMilli(1_700_000_000_000)}})
		cancel()
		if commitErr == nil {
			acked++
		}
	}
	require.Error(t, commitErr, "a commit met the immutable directory")
	require.ErrorContains(t, b.Err(), "cannot create new mem table")
	require.ErrorContains(t, b.Err(), "operation not permitted")
	// The buffer refuses reads from now on, but a read that began before
	// the failure (the uplink's scan racing the commit that met it) still
	// reads Badger: it must find a memtable.
	_, err = b.PendingRefs(0, 1)
	require.ErrorIs(t, err, ErrFailed)
	queued := 0
	require.NotPanics(t, func() {
		require.NoError(t, b.db.View(func(txn *badger.Txn) error {
			it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(queuePrefix)})
			defer it.Close()
			for it.Rewind(); it.Valid(); it.Next() {
				queued++
			}
			return nil
		}))
	})
	require.Equal(t, acked, queued, "queue entries read from Badger after the failure")
	require.ErrorIs(t, b.Close(), ErrFailed)

	out, err := exec.Command("chattr", "-i", dir).CombinedOutput()
	require.NoError(t, err, "%s", out)
	// A failed buffer leaves Badger open (gatewayd exits, and its next
	// start replays what is on disk); the test closes it instead.
	require.NoError(t, b.db.Close())
	requireIncompressible(t, open(t, dir, opts), acked)
	t.Logf("%d batches acknowledged before the failed rotation, all read back", acked)
}
