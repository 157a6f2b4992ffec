package buffer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/dgraph-io/ristretto/v2/z"
	"github.com/stretchr/testify/require"
)

// TestBatchesBeyondTheMemtablesReachTables writes several memtables' worth
// of batches whose payloads do not compress, so that Badger flushes its
// memtables into tables and compacts them with table builders that
// outgrow their first allocation, and reads every batch back after a
// restart. It runs on 32-bit ARM too (TestOn32BitARM), where such a
// builder once spun for ever.
func TestBatchesBeyondTheMemtablesReachTables(t *testing.T) {
	dir := t.TempDir()
	opts := Options{MemTableSize: 1 << 20}
	b := open(t, dir, opts)
	const n = 3000
	commitIncompressible(t, b, n)
	waitForTables(t, dir, 2)
	require.NoError(t, b.Close())

	requireIncompressible(t, open(t, dir, opts), n)
}

// waitForTables waits until dir holds at least n tables: memtables are
// flushed in the background.
func waitForTables(t *testing.T, dir string, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		tables, err := filepath.Glob(filepath.Join(dir, "*.sst"))
		return err == nil && len(tables) >= n
	}, 2*time.Minute, 50*time.Millisecond, "memtables flushed to tables")
}

// incompressible is the payload of batch i: 2,000 bytes that do not
// compress, so that a few thousand batches fill several memtables.
func incompressible(i int) []byte {
	p := make([]byte, 2000)
	r := rand.New(rand.NewPCG(uint64(i), 7))
	for k := range p {
		p[k] = byte(r.Uint32())
	}
	return p
}

// commitIncompressible stores batches batch-00000 to batch-<n-1>, 50 to a
// commit, each with its incompressible payload.
func commitIncompressible(t *testing.T, b *Buffer, n int) {
	t.Helper()
	const perGroup = 50
	for first := 0; first < n; first += perGroup {
		entries := make([]Entry, min(perGroup, n-first))
		for k := range entries {
			i := first + k
			p := incompressible(i)
			entries[k] = Entry{BatchID: fmt.Sprintf("batch-%05d", i), HardwareID: "AA:BB:CC:DD:EE:FF",
				Hash: sha256.Sum256(p), Payload: p, ReceivedAt: time.UnixMilli(1_700_000_000_000)}
		}
		out, err := b.Commit(context.Background(), entries)
		require.NoError(t, err)
		for k, o := range out {
			require.Equal(t, Stored, o, "batch %d", first+k)
		}
	}
}

// requireIncompressible reads back, in order, the n batches
// commitIncompressible stored, each with its payload.
func requireIncompressible(t *testing.T, b *Buffer, n int) {
	t.Helper()
	require.EqualValues(t, n, b.Stats().PendingBatches)
	var after uint64
	for i := 0; i < n; {
		got, err := b.Pending(after, 500)
		require.NoError(t, err)
		require.NotEmpty(t, got, "pending batches from %d on", i)
		for _, p := range got {
			require.Equal(t, fmt.Sprintf("batch-%05d", i), p.BatchID)
			require.Equal(t, incompressible(i), p.Payload, "batch %d", i)
			i++
			after = p.Seq
		}
	}
}

// TestAllocatorGrowsPastItsFirstBuffer fills the allocator Badger's table
// builders use well past its first buffer and checks that every
// allocation kept its bytes. On 32-bit ARM (TestOn32BitARM) the vendored
// allocator once went back to the start of its first buffer instead.
func TestAllocatorGrowsPastItsFirstBuffer(t *testing.T) {
	a := z.NewAllocator(1024, "test")
	defer a.Release()
	var got [][]byte
	for i := range 200 {
		b := a.Allocate(1000)
		for k := range b {
			b[k] = byte(i)
		}
		got = append(got, b)
	}
	for i, b := range got {
		require.Equal(t, bytes.Repeat([]byte{byte(i)}, 1000), b, "allocation %d", i)
	}
}
