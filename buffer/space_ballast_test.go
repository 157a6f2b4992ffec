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
