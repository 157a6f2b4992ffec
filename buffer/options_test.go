package buffer

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBadgerOptionsFitTheAddressSpace checks the Badger settings of both
// word sizes, and that the running machine gets its own: on 32-bit ARM
// (TestOn32BitARM runs it there) the value log files are smaller, so that
// what Badger maps besides its tables (each value log file and each
// memtable's write-ahead log at twice its size) stays small in a 3 GiB
// address space.
func TestBadgerOptionsFitTheAddressSpace(t *testing.T) {
	for _, memtable := range []int64{1 << 20, DefaultOptions().MemTableSize, 64 << 20} {
		opts := Options{MemTableSize: memtable}.withDefaults()
		bo := badgerOptions(t.TempDir(), opts, nil)
		require.Equal(t, 2*memtable, bo.ValueLogFileSize, "values over memtable/8 only: a small value log")
		require.Less(t, bo.ValueLogFileSize, int64(1<<31-1), "Badger's limit")
		// Mapped at once: a value log file and the write-ahead logs, each
		// at twice its size. A 32-bit Pi has 2-3 GiB of address space.
		mapped := 2*bo.ValueLogFileSize + int64(bo.NumMemtables)*2*bo.MemTableSize
		require.LessOrEqual(t, mapped, 8*memtable)
		require.Equal(t, 2, bo.NumMemtables)
		require.Equal(t, memtable, bo.MemTableSize)
	}
}
