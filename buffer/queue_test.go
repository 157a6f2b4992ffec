package buffer

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Badger's caches keep goroutines that stop after Close returns.
		goleak.IgnoreTopFunction("github.com/dgraph-io/ristretto/v2.(*defaultPolicy[...]).processItems"),
		goleak.IgnoreTopFunction("github.com/dgraph-io/ristretto/v2.(*Cache[...]).processItems"),
		goleak.IgnoreTopFunction("github.com/dgraph-io/badger/v4/y.(*WaterMark).process"),
		goleak.IgnoreAnyFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
		// A badger.Open that fails (a damaged MANIFEST or KEYREGISTRY) does
		// not stop these two; a DB that opened stops them at Close.
		goleak.IgnoreTopFunction("github.com/dgraph-io/badger/v4.(*DB).monitorCache"),
		goleak.IgnoreTopFunction("github.com/dgraph-io/ristretto/v2/z.(*AllocatorPool).freeupAllocators"),
	)
}

func entry(id, payload string) Entry {
	return Entry{BatchID: id, HardwareID: "AA:BB:CC:DD:EE:FF", Hash: sha256.Sum256([]byte(payload)),
		Payload: []byte(payload), ReceivedAt: time.UnixMilli(1_700_000_000_000)}
}

func open(tb testing.TB, dir string, opts Options) *Buffer {
	tb.Helper()
	b, err := Open(dir, opts, nil, nil)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = b.Close() })
	return b
}

func TestCommitOutcomes(t *testing.T) {
	tests := []struct {
		name  string
		first []Entry
		then  []Entry
		want  []Outcome
	}{
		{"new batches are stored", nil, []Entry{entry("a", "1"), entry("b", "2")}, []Outcome{Stored, Stored}},
		{"same payload is a duplicate", []Entry{entry("a", "1")}, []Entry{entry("a", "1")}, []Outcome{Duplicate}},
		{"other payload is a conflict", []Entry{entry("a", "1")}, []Entry{entry("a", "2")}, []Outcome{Conflict}},
		{"repeat inside one commit", nil, []Entry{entry("a", "1"), entry("a", "1"), entry("a", "3")}, []Outcome{Stored, Duplicate, Conflict}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := open(t, t.TempDir(), Options{})
			if tt.first != nil {
				_, err := b.Commit(context.Background(), tt.first)
				require.NoError(t, err)
			}
			got, err := b.Commit(context.Background(), tt.then)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

// Submit queues without waiting, and what is queued in order is stored in
// that order, whenever its waits are called.
func TestSubmitStoresInTheOrderQueued(t *testing.T) {
	b := open(t, t.TempDir(), Options{})
	const n = 200
	waits := make([]func() ([]Outcome, error), n)
	for i := range n {
		w, err := b.Submit(context.Background(), []Entry{entry(fmt.Sprintf("s%03d", i), fmt.Sprint(i))})
		require.NoError(t, err)
		waits[i] = w
	}
	for i := n - 1; i >= 0; i-- { // answered whatever the order of the waits
		out, err := waits[i]()
		require.NoError(t, err)
		require.Equal(t, []Outcome{Stored}, out)
	}
	p, err := b.Pending(0, n+1)
	require.NoError(t, err)
	require.Len(t, p, n)
	for i, q := range p {
		require.Equal(t, fmt.Sprintf("s%03d", i), q.BatchID)
	}

	require.NoError(t, b.Close())
	_, err = b.Submit(context.Background(), []Entry{entry("late", "x")})
	require.ErrorIs(t, err, ErrClosed, "nothing queued after Close")
}

func TestPendingSurvivesRestartInOrder(t *testing.T) {
	dir := t.TempDir()
	b, err := Open(dir, Options{}, nil, nil)
	require.NoError(t, err)
	for i := range 5 {
		_, err := b.Commit(context.Background(), []Entry{entry(fmt.Sprintf("id-%d", i), fmt.Sprint(i))})
		require.NoError(t, err)
	}
	require.NoError(t, b.Close())
	require.NoError(t, b.Close(), "Close is idempotent")

	b = open(t, dir, Options{})
	st := b.Stats()
	require.EqualValues(t, 5, st.PendingBatches)
	require.Equal(t, time.UnixMilli(1_700_000_000_000), st.Oldest)
	got, err := b.Pending(0, 100)
	require.NoError(t, err)
	require.Len(t, got, 5)
	for i, p := range got {
		require.Equal(t, fmt.Sprintf("id-%d", i), p.BatchID)
		require.Equal(t, fmt.Sprint(i), string(p.Payload))
		require.Equal(t, "AA:BB:CC:DD:EE:FF", p.HardwareID)
	}
	// A resend after the restart is still a duplicate.
	out, err := b.Commit(context.Background(), []Entry{entry("id-3", "3"), entry("id-9", "9")})
	require.NoError(t, err)
	require.Equal(t, []Outcome{Duplicate, Stored}, out)
	more, err := b.Pending(got[4].Seq, 100)
	require.NoError(t, err)
	require.Len(t, more, 1)
	require.Equal(t, "id-9", more[0].BatchID)
	require.Greater(t, more[0].Seq, got[4].Seq, "sequence numbers continue after a restart")
}

func TestDeliveredMarkersAnswerDuplicateUntilCollected(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	opts := Options{Retention: time.Hour}
	opts.now = func() time.Time { return now }
	b := open(t, t.TempDir(), opts)
	_, err := b.Commit(context.Background(), []Entry{entry("a", "1"), entry("b", "2")})
	require.NoError(t, err)
	pend, err := b.Pending(0, 10)
	require.NoError(t, err)
	require.NoError(t, b.MarkDelivered(pend[:1]))
	require.EqualValues(t, 1, b.Stats().PendingBatches)
	require.EqualValues(t, len(encodePending(pend[1])), b.Stats().PendingBytes)
	state, err := b.Lookup("a")
	require.NoError(t, err)
	require.Equal(t, "delivered", state)

	out, err := b.Commit(context.Background(), []Entry{entry("a", "1")})
	require.NoError(t, err)
	require.Equal(t, []Outcome{Duplicate}, out)

	n, err := b.Collect()
	require.NoError(t, err)
	require.Zero(t, n, "within retention nothing is collected")

	now = now.Add(time.Hour + time.Second)
	n, err = b.Collect()
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = b.Lookup("a")
	require.ErrorIs(t, err, ErrNotFound)
	state, err = b.Lookup("b")
	require.NoError(t, err)
	require.Equal(t, "pending", state, "undelivered batches are never collected")
}

func TestBudgetRefusesNewBatchesButAnswersDuplicates(t *testing.T) {
	big := string(make([]byte, 60))
	a, c := entry("a", big), entry("c", "x")
	// Room for a and c, not for a and b.
	budget := cost(a) + cost(c)
	b := open(t, t.TempDir(), Options{MaxPendingBytes: budget})
	out, err := b.Commit(context.Background(), []Entry{a, entry("b", big)})
	require.NoError(t, err)
	require.Equal(t, []Outcome{Stored, Full}, out)
	out, err = b.Commit(context.Background(), []Entry{a, c})
	require.NoError(t, err)
	require.Equal(t, []Outcome{Duplicate, Stored}, out, "a small batch still fits")
	_, err = b.Lookup("b")
	require.ErrorIs(t, err, ErrNotFound, "a refused batch leaves no marker")
	require.LessOrEqual(t, b.Stats().UsedBytes, budget)
}

func TestFailedCommitStoresNothingAndReportsError(t *testing.T) {
	fail := errors.New("injected disk failure")
	opts := Options{}
	var mu sync.Mutex
	failing := true
	opts.beforeCommit = func() error {
		mu.Lock()
		defer mu.Unlock()
		if failing {
			return fail
		}
		return nil
	}
	b := open(t, t.TempDir(), opts)
	out, err := b.Commit(context.Background(), []Entry{entry("a", "1")})
	require.ErrorIs(t, err, fail)
	require.Nil(t, out)
	require.Zero(t, b.Stats().PendingBatches)
	_, err = b.Lookup("a")
	require.ErrorIs(t, err, ErrNotFound)

	mu.Lock()
	failing = false
	mu.Unlock()
	out, err = b.Commit(context.Background(), []Entry{entry("a", "1")})
	require.NoError(t, err)
	require.Equal(t, []Outcome{Stored}, out, "the resend after a failure is stored, not a duplicate")
}

// TestValueLogSyncFailureFailsTheCommit: Badger logs a failed msync of the
// value log instead of returning it (value.go valueLog.write); the commit
// must fail all the same.
func TestValueLogSyncFailureFailsTheCommit(t *testing.T) {
	var b *Buffer
	fail := true
	opts := Options{}
	opts.beforeCommit = func() error {
		if fail {
			// What Badger logs during the commit when the msync fails.
			b.db.Opts().Logger.Errorf("Error while curlf sync: %v\n", syscall.EIO)
		}
		return nil
	}
	b = open(t, t.TempDir(), opts)
	_, err := b.Commit(context.Background(), []Entry{entry("a", "1")})
	require.ErrorContains(t, err, "badger could not sync its value log")
	require.EqualValues(t, 1, b.Stats().PendingBatches, "the batch is in the log, counted, just not acknowledged")
	fail = false
	out, err := b.Commit(context.Background(), []Entry{entry("a", "1")})
	require.NoError(t, err)
	require.Equal(t, []Outcome{Duplicate}, out, "the batch did reach the log; the resend is a duplicate")
	requireUsageMatchesDisk(t, b)
}

func TestConcurrentCommitsStoreEachBatchOnce(t *testing.T) {
	b := open(t, t.TempDir(), Options{})
	const writers, perWriter = 16, 50
	var wg sync.WaitGroup
	var mu sync.Mutex
	counts := map[Outcome]int{}
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				// Every batch is sent by two writers.
				id := fmt.Sprintf("w%d-%d", w/2, i)
				out, err := b.Commit(context.Background(), []Entry{entry(id, id)})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				counts[out[0]]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Equal(t, writers/2*perWriter, counts[Stored])
	require.Equal(t, writers/2*perWriter, counts[Duplicate])
	require.EqualValues(t, writers/2*perWriter, b.Stats().PendingBatches)
	all, err := b.Pending(0, 10_000)
	require.NoError(t, err)
	require.Len(t, all, writers/2*perWriter)
}

func TestSplitGroupBeyondOneTransaction(t *testing.T) {
	// A 1 MiB memtable allows transactions of about 150 KiB; 64 batches of
	// 8 KiB need several, committed before anyone is answered.
	b := open(t, t.TempDir(), Options{MemTableSize: 1 << 20})
	var entries []Entry
	for i := range 64 {
		entries = append(entries, entry(fmt.Sprintf("big-%d", i), fmt.Sprintf("%08d", i)+string(make([]byte, 8<<10))))
	}
	out, err := b.Commit(context.Background(), entries)
	require.NoError(t, err)
	for _, o := range out {
		require.Equal(t, Stored, o)
	}
	require.EqualValues(t, 64, b.Stats().PendingBatches)
}

func TestCommitAfterCloseFails(t *testing.T) {
	b, err := Open(t.TempDir(), Options{}, nil, nil)
	require.NoError(t, err)
	require.NoError(t, b.Close())
	_, err = b.Commit(context.Background(), []Entry{entry("a", "1")})
	require.ErrorIs(t, err, ErrClosed)
	_, err = b.Pending(0, 1)
	require.ErrorIs(t, err, ErrClosed)
}

func BenchmarkCommitParallel(b *testing.B) {
	buf := open(b, b.TempDir(), Options{})
	payload := string(make([]byte, 600))
	var n sync.Mutex
	i := 0
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			n.Lock()
			i++
			id := fmt.Sprintf("id-%d", i)
			n.Unlock()
			if _, err := buf.Commit(context.Background(), []Entry{entry(id, payload)}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// TestFailedWriteStopsTheBuffer: once a commit fails in Badger (the disk
// failed), nothing more is written, Failed is closed and Err says why, and
// Close leaves Badger alone; a reopen finds what was acknowledged before.
func TestFailedWriteStopsTheBuffer(t *testing.T) {
	dir := t.TempDir()
	var failing atomic.Bool
	opts := Options{failCommit: func() error {
		if failing.Load() {
			return syscall.EIO
		}
		return nil
	}}
	b, err := Open(dir, opts, nil, nil)
	require.NoError(t, err)
	out, err := b.Commit(context.Background(), []Entry{entry("a", "1")})
	require.NoError(t, err)
	require.Equal(t, []Outcome{Stored}, out)
	require.NoError(t, b.Err())

	failing.Store(true)
	_, err = b.Commit(context.Background(), []Entry{entry("b", "2")})
	require.ErrorIs(t, err, syscall.EIO)
	select {
	case <-b.Failed():
	default:
		t.Fatal("Failed is not closed after a failed write")
	}
	require.ErrorIs(t, b.Err(), ErrFailed)
	require.ErrorContains(t, b.Err(), dir)

	failing.Store(false) // the disk "works" again: the open buffer still refuses
	_, err = b.Commit(context.Background(), []Entry{entry("c", "3")})
	require.ErrorIs(t, err, ErrFailed)
	require.ErrorIs(t, b.SaveState("s", []byte("x")), ErrFailed)
	_, err = b.Pending(0, 10)
	require.ErrorIs(t, err, ErrFailed)
	require.ErrorIs(t, b.Close(), ErrFailed, "Close reports the failure and leaves Badger as the disk has it")
	// The process would exit now. Here Badger itself is intact (the
	// failure was injected in place of its commit): close it to reopen.
	require.NoError(t, b.db.Close())

	b, err = Open(dir, Options{}, nil, nil)
	require.NoError(t, err, "the next start opens what is on disk")
	defer b.Close()
	pending, err := b.Pending(0, 10)
	require.NoError(t, err)
	require.Len(t, pending, 1)
	require.Equal(t, "a", pending[0].BatchID, "the acknowledged batch, and only it")
}
