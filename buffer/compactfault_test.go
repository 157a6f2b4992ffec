package buffer

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/table"
	"github.com/dgraph-io/badger/v4/y"
	"github.com/stretchr/testify/require"
)

// TestACompactionThatCannotWriteItsTableLosesNothing makes every table a
// compaction writes fail as on a full disk, then reopens the buffer and
// reads every batch back. Upstream Badger committed such a compaction
// without the table it could not write: the batches in it were gone.
func TestACompactionThatCannotWriteItsTableLosesNothing(t *testing.T) {
	dir := t.TempDir()
	// No background compactions: the test runs the only one, and two
	// tables on level 0 are enough for it to have work.
	opts := Options{MemTableSize: 1 << 20, tuneBadger: func(o *badger.Options) {
		o.NumCompactors = 0
		o.NumLevelZeroTables = 2
	}}
	b := open(t, dir, opts)
	const n = 2000
	commitIncompressible(t, b, n)
	waitForTables(t, dir, 2)

	var mu sync.Mutex
	var refused []string
	fault := func(fname string) error {
		if !strings.HasPrefix(fname, dir) {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		refused = append(refused, fname)
		return syscall.ENOSPC
	}
	table.CreateTableFault.Store(&fault)
	t.Cleanup(func() { table.CreateTableFault.Store(nil) })
	err := b.db.Flatten(1)
	table.CreateTableFault.Store(nil)
	require.NotEmpty(t, refused, "tables refused")
	for _, name := range refused {
		require.NoFileExists(t, name, "a table that could not be written is removed")
	}
	require.NoError(t, b.Close())

	requireIncompressible(t, open(t, dir, opts), n)
	require.Error(t, err, "a compaction whose tables could not be written")
	require.ErrorContains(t, err, syscall.ENOSPC.Error())
}

// TestThrottleKeepsEveryWorkersError runs workers that all fail through
// Badger's throttle, one at a time. Upstream, Done blocked for good when
// the throttle already held as many errors as workers, and an error Do
// took was not returned by Finish: a compaction could succeed without
// the table a worker failed to write.
func TestThrottleKeepsEveryWorkersError(t *testing.T) {
	for round := range 50 {
		done := make(chan error, 1)
		go func() {
			th := y.NewThrottle(1)
			for i := range 20 {
				if err := th.Do(); err != nil {
					break
				}
				th.Done(fmt.Errorf("worker %d failed", i))
			}
			done <- th.Finish()
		}()
		select {
		case err := <-done:
			require.Error(t, err, "round %d: Finish after failed workers", round)
			require.True(t, strings.HasPrefix(err.Error(), "worker "), "round %d: %v", round, err)
		case <-time.After(time.Minute):
			t.Fatalf("round %d: the throttle hung", round)
		}
	}

	// An error Do returned is Finish's too.
	for round := range 50 {
		th := y.NewThrottle(1)
		var doErr error
		for i := 0; doErr == nil; i++ {
			if doErr = th.Do(); doErr == nil {
				th.Done(errors.New("failed"))
			}
		}
		require.Error(t, th.Finish(), "round %d", round)
	}
}
