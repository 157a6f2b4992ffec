package buffer

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBallastIsMadeWithRoomAndDeletedOnAFullDisk(t *testing.T) {
	dir := t.TempDir()
	b := newBallast(dir, 1<<20, discardLogger())
	require.Equal(t, int64(12<<20), b.size, "twice a write-ahead log and a value log file")
	const minFree = 25 << 20

	b.keep(minFree+12<<20-1, true, minFree)
	require.False(t, b.exists(), "not made while it would take the watermark's space")
	b.keep(1<<40, false, minFree)
	require.False(t, b.exists(), "nothing without a known free space")
	b.keep(minFree+12<<20, true, minFree)
	require.True(t, b.exists())
	fi, err := os.Stat(filepath.Join(dir, ballastName))
	require.NoError(t, err)
	require.Equal(t, int64(12<<20), fi.Size())
	_, err = os.Stat(filepath.Join(dir, ballastName+".tmp"))
	require.ErrorIs(t, err, os.ErrNotExist)

	b.keep(12<<20, true, minFree)
	require.True(t, b.exists(), "kept while free space covers it")
	b.keep(12<<20-1, true, minFree)
	require.False(t, b.exists(), "deleted on a full disk")
}

func TestRemoveEmptyLogs(t *testing.T) {
	dir := t.TempDir()
	for name, size := range map[string]int{"00001.mem": 0, "00002.mem": 10, "000001.vlog": 0, "000002.vlog": 20, "000003.sst": 0} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), make([]byte, size), 0o600))
	}
	require.NoError(t, removeEmptyLogs(dir, discardLogger()))
	names, err := filepath.Glob(filepath.Join(dir, "*"))
	require.NoError(t, err)
	for i := range names {
		names[i] = filepath.Base(names[i])
	}
	require.ElementsMatch(t, []string{"00002.mem", "000002.vlog", "000003.sst"}, names,
		"empty logs go, everything else stays")
}
