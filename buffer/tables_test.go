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

	"github.com/dgraph-io/badger/v4"
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

// TestTablesOverlapFewTablesOfTheNextLevel stores 4,000 batches of 6,000
// bytes that do not compress (a memtable holds about 170, with their
// markers) and watches Badger's tables meanwhile: no table below L0
// overlaps more than 10 tables of the next level, so compacting one takes
// at most it and those ten, the space RequiredFreeBytes counts for it. A
// table that ends one key prefix (the markers, "b/") and starts the next
// (the queue, "q/") would span every queue table below it.
func TestTablesOverlapFewTablesOfTheNextLevel(t *testing.T) {
	b := open(t, t.TempDir(), Options{MemTableSize: 1 << 20})
	worst, worstAt := 0, ""
	check := func() {
		levels := map[int][]badger.TableInfo{}
		for _, ti := range b.db.Tables() {
			levels[ti.Level] = append(levels[ti.Level], ti)
		}
		for l, tables := range levels {
			if l == 0 {
				continue
			}
			for _, ti := range tables {
				n := 0
				for _, o := range levels[l+1] {
					if bytes.Compare(o.Left, ti.Right) <= 0 && bytes.Compare(o.Right, ti.Left) >= 0 {
						n++
					}
				}
				if n > worst {
					worst, worstAt = n, fmt.Sprintf("L%d table %d (%d keys, %q to %q)", l, ti.ID, ti.KeyCount, ti.Left, ti.Right)
				}
			}
		}
	}
	const perGroup = 20
	for g := range 200 {
		entries := make([]Entry, perGroup)
		for k := range entries {
			i := g*perGroup + k
			p := append(append(incompressible(i), incompressible(i+1e6)...), incompressible(i+2e6)...)
			entries[k] = Entry{BatchID: fmt.Sprintf("AA:BB:CC:DD:EE:FF_%013d", 1_700_000_000_000+int64(i)*5000), HardwareID: "AA:BB:CC:DD:EE:FF",
				Hash: sha256.Sum256(p), Payload: p, ReceivedAt: time.UnixMilli(1_700_000_000_000)}
		}
		_, err := b.Commit(context.Background(), entries)
		require.NoError(t, err)
		check()
	}
	for range 100 { // compactions go on in the background
		time.Sleep(10 * time.Millisecond)
		check()
	}
	require.LessOrEqual(t, worst, 10, "the widest table: %s", worstAt)
	t.Logf("a table overlapped at most %d tables of the next level (%s)", worst, worstAt)
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
