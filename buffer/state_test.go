package buffer

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

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

// State records go through the committer: a save waiting behind a group
// joins the next group with the batches waiting too, and both are answered
// after that group's one synced transaction.
func TestStateSavesJoinTheGroupCommit(t *testing.T) {
	release := make(chan struct{})
	var blocked atomic.Bool
	var groups atomic.Int64
	opts := Options{}
	opts.beforeCommit = func() error {
		groups.Add(1)
		if blocked.CompareAndSwap(true, false) {
			<-release
		}
		return nil
	}
	b := open(t, t.TempDir(), opts)
	blocked.Store(true)
	first, err := b.Submit(context.Background(), []Entry{entry("a", "1")})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return !blocked.Load() }, 10*time.Second, time.Millisecond,
		"the first group reaches its commit")
	saved := make(chan error, 1)
	go func() { saved <- b.SaveStates(map[string][]byte{"dev/A": []byte("1"), "keys": []byte("k")}) }()
	second, err := b.Submit(context.Background(), []Entry{entry("b", "2")})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(b.reqs) == 2 }, 10*time.Second, time.Millisecond)
	select {
	case err := <-saved:
		t.Fatalf("the save returned before the committer took it: %v", err)
	default:
	}
	before := groups.Load()
	close(release)
	_, err = first()
	require.NoError(t, err)
	out, err := second()
	require.NoError(t, err)
	require.Equal(t, []Outcome{Stored}, out)
	require.NoError(t, <-saved)
	require.EqualValues(t, 1, groups.Load()-before, "the batch and the records in one more group commit")
	all, err := b.LoadStates("")
	require.NoError(t, err)
	require.Equal(t, map[string][]byte{"dev/A": []byte("1"), "keys": []byte("k")}, all)
	require.EqualValues(t, 2, b.usage.stateRecords.Load())
	requireUsageMatchesDisk(t, b)
}
