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
	const groups, perGroup, size = 60, 50, 2000
	payload := func(i int) []byte {
		p := make([]byte, size)
		r := rand.New(rand.NewPCG(uint64(i), 7))
		for k := range p {
			p[k] = byte(r.Uint32())
		}
		return p
	}
	for g := range groups {
		entries := make([]Entry, perGroup)
		for k := range entries {
			i := g*perGroup + k
			p := payload(i)
			entries[k] = Entry{BatchID: fmt.Sprintf("batch-%05d", i), HardwareID: "AA:BB:CC:DD:EE:FF",
				Hash: sha256.Sum256(p), Payload: p, ReceivedAt: time.UnixMilli(1_700_000_000_000)}
		}
		out, err := b.Commit(context.Background(), entries)
		require.NoError(t, err)
		for k, o := range out {
			require.Equal(t, Stored, o, "batch %d", g*perGroup+k)
		}
	}
	// The flushes run in the background; the tables show they happened.
	require.Eventually(t, func() bool {
		tables, err := filepath.Glob(filepath.Join(dir, "*.sst"))
		return err == nil && len(tables) >= 2
	}, 2*time.Minute, 50*time.Millisecond, "memtables flushed to tables")
	require.NoError(t, b.Close())

	b = open(t, dir, opts)
	require.EqualValues(t, groups*perGroup, b.Stats().PendingBatches)
	var after uint64
	for i := 0; i < groups*perGroup; {
		got, err := b.Pending(after, 500)
		require.NoError(t, err)
		require.NotEmpty(t, got, "pending batches from %d on", i)
		for _, p := range got {
			require.Equal(t, fmt.Sprintf("batch-%05d", i), p.BatchID)
			require.Equal(t, payload(i), p.Payload, "batch %d", i)
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
