package buffer

import (
	"testing"
	"time"

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

func TestOptionsValidate(t *testing.T) {
	require.NoError(t, DefaultOptions().Validate())
	require.NoError(t, Options{}.Validate())
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"negative budget", Options{MaxPendingBytes: -1}, "buffer.max_pending_bytes"},
		{"tiny memtable", Options{MemTableSize: 1000}, "buffer.memtable_size"},
		{"unknown policy", Options{FullPolicy: "drop_newest"}, `buffer.full_policy: "drop_newest" is not one of reject_new, drop_oldest`},
		{"watermark below what badger may write", Options{MinFreeBytes: 64 << 20}, "buffer.min_free_bytes: 67108864 is less than 184549376"},
		{"watermark too low for a larger memtable", Options{MinFreeBytes: 256 << 20, MemTableSize: 64 << 20}, "buffer.min_free_bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.ErrorContains(t, tt.opts.Validate(), tt.want)
		})
	}
	_, err := Open(t.TempDir(), Options{Retention: -time.Second}, nil, nil)
	require.ErrorContains(t, err, "buffer.retention")
	require.Equal(t, int64(176<<20), RequiredFreeBytes(8<<20))
	require.Equal(t, int64(352<<20), RequiredFreeBytes(16<<20))
	require.Equal(t, int64(25<<20), RequiredFreeBytes(1<<20))
}
