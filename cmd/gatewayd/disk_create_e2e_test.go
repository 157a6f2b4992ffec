package main

import (
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/harness/faultfs"
)

// TestFileCreationFailuresStopCleanly runs gatewayd on the fault-injecting
// file system with small memtables and, while a device posts batches and the
// uplink reads the queue to forward them, makes the creation of one kind of
// Badger file fail with EPERM, as on a card the kernel turned read-only: a
// memtable's write-ahead log (made at each memtable rotation) and a table
// (made at each memtable flush). gatewayd withholds what it could not
// commit, stops with one clear line and no panic, and once the disk works
// again a restart delivers every acknowledged batch exactly once.
func TestFileCreationFailuresStopCleanly(t *testing.T) {
	if testing.Short() {
		t.Skip("runs gatewayd on a FUSE file system")
	}
	ffs := mountPowerCutDisk(t)
	local, view, key, prefix := setup(t)
	dataDir := powerCutDataDir(t, ffs)
	env := []string{fmt.Sprintf("GATEWAY_BUFFER_MEMTABLE_SIZE=%d", diskMemTable),
		fmt.Sprintf("GATEWAY_BUFFER_MIN_FREE_BYTES=%d", buffer.RequiredFreeBytes(diskMemTable))}
	hw := "02:00:00:00:D1:C0"
	boot := uuid.NewString()
	acked := map[string]bool{}
	next := 0
	for _, kind := range []string{"*.mem", "*.sst"} {
		d := startDaemon(t, dataDir, local.Endpoint, prefix, env...)
		for range 20 {
			code, _, results, err := tryPost(d, key, [][]byte{denseBatch(hw, boot, next)})
			next++
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, code)
			acked[results[0].BatchID] = true
		}
		id := ffs.Inject(faultfs.Rule{Op: faultfs.OpCreate, Path: kind, Err: syscall.EPERM})
		refused, sent := 0, 0
		// A 1 MiB memtable holds a few hundred of these batches: enough
		// to rotate (and flush) several times over.
		for ; sent < 5000; sent++ {
			code, _, results, err := tryPost(d, key, [][]byte{denseBatch(hw, boot, next)})
			next++
			if err != nil {
				break // gatewayd stopped
			}
			if code == http.StatusOK {
				acked[results[0].BatchID] = true
			} else {
				refused++
			}
		}
		select {
		case err := <-d.exited:
			d.exited <- err
			require.Error(t, err, "gatewayd exits non-zero")
		case <-time.After(60 * time.Second):
			t.Fatalf("gatewayd did not stop when %s could not be created (%d batches sent); logs:\n%s", kind, sent, d.logs.String())
		}
		logs := d.logs.String()
		for _, crash := range []string{"SIGBUS", "unexpected fault address", "fatal error", "panic:", "Assert failed", "nil pointer"} {
			require.NotContains(t, logs, crash, "creating %s failed", kind)
		}
		require.Contains(t, logs, "a write to the data directory failed")
		require.Contains(t, logs, "operation not permitted")
		require.Positive(t, ffs.Failed(id), "the creation of %s was refused", kind)
		t.Logf("%s not created: %d batches sent, %d refused before gatewayd stopped", kind, sent, refused)
		ffs.ClearFaults()
	}
	d := startDaemon(t, dataDir, local.Endpoint, prefix, env...)
	require.Eventually(t, func() bool { return d.metric(t, "gateway_buffer_pending_batches") == "0" },
		60*time.Second, 200*time.Millisecond)
	markers := view.markers(t)
	for id := range acked {
		require.Equal(t, 1, markers[id], "acknowledged batch %s delivered once", id)
	}
	for k, n := range view.readings(t, hw) {
		require.Equal(t, 1, n, "reading %s stored once", k)
	}
	t.Logf("%d acknowledged batches delivered once after the disk recovered", len(acked))
}
