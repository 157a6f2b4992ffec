package buffer

import (
	"strconv"
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
	opts := DefaultOptions().withDefaults()
	tests := []struct {
		intSize      int
		wantVlog     int64
		maxMappedMiB int64
	}{
		{64, valueLogFileSize, 256},
		{32, valueLogFileSize32, 128},
	}
	for _, tt := range tests {
		t.Run(strconv.Itoa(tt.intSize)+"-bit", func(t *testing.T) {
			bo := badgerOptionsFor(t.TempDir(), opts, nil, tt.intSize)
			require.Equal(t, tt.wantVlog, bo.ValueLogFileSize)
			require.Less(t, bo.ValueLogFileSize, int64(1<<31-1), "Badger's limit")
			mapped := 2*bo.ValueLogFileSize + int64(bo.NumMemtables)*2*bo.MemTableSize
			require.LessOrEqual(t, mapped, tt.maxMappedMiB<<20)
			require.Equal(t, 2, bo.NumMemtables)
			require.Equal(t, opts.MemTableSize, bo.MemTableSize)
		})
	}
	got := badgerOptions(t.TempDir(), opts, nil)
	require.Equal(t, badgerOptionsFor(t.TempDir(), opts, nil, strconv.IntSize).ValueLogFileSize, got.ValueLogFileSize,
		"this machine (%d-bit) gets its own settings", strconv.IntSize)
	if strconv.IntSize == 32 {
		require.Equal(t, int64(valueLogFileSize32), got.ValueLogFileSize)
	}
}
