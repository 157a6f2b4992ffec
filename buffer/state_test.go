package buffer

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestStateRecords(t *testing.T) {
	dir := t.TempDir()
	b, err := Open(dir, Options{}, nil, nil)
	require.NoError(t, err)
	v, err := b.LoadState("keys")
	require.NoError(t, err)
	require.Nil(t, v)
	require.NoError(t, b.SaveState("keys", []byte("cache")))
	require.NoError(t, b.Close())
	b = open(t, dir, Options{})
	v, err = b.LoadState("keys")
	require.NoError(t, err)
	require.Equal(t, "cache", string(v))
	require.NoError(t, b.SaveState("dev/A", []byte("1")))
	require.NoError(t, b.SaveState("dev/B", []byte("2")))
	all, err := b.LoadStates("dev/")
	require.NoError(t, err)
	require.Equal(t, map[string][]byte{"dev/A": []byte("1"), "dev/B": []byte("2")}, all)
}

// A registry flush after a busy interval saves thousands of device records
// at once: more than one Badger transaction holds.
func TestSaveStatesLargerThanOneTransaction(t *testing.T) {
	dir := t.TempDir()
	b, err := Open(dir, Options{}, nil, nil)
	require.NoError(t, err)
	records := make(map[string][]byte)
	for i := range 6000 {
		records[fmt.Sprintf("dev/%05d", i)] = bytes.Repeat([]byte{byte(i)}, 1024)
	}
	require.NoError(t, b.SaveStates(records))
	require.EqualValues(t, 6000, b.usage.stateRecords.Load())
	records["dev/00000"] = []byte("changed")
	require.NoError(t, b.SaveStates(records), "overwriting them all again")
	require.EqualValues(t, 6000, b.usage.stateRecords.Load())
	want := b.Usage().State
	require.NoError(t, b.Close())
	b = open(t, dir, Options{})
	all, err := b.LoadStates("dev/")
	require.NoError(t, err)
	require.Equal(t, records, all)
	require.Equal(t, want, b.Usage().State, "counted as a full scan counts it")
}
