package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/harness/faultfs"
)

// TestPowerCutRightAfterStart cuts the power right after gatewayd became
// ready, before any batch, three times, and starts it again: Badger has
// just created a write-ahead log (.mem) and sized it with ftruncate, and
// fsynced the directory, but nothing has fsynced the log itself.
//
// Under faultfs.Journaled (ext4, xfs: the directory fsync commits the
// size too) the log comes back full size. Under faultfs.Strict
// (GATEWAY_POWERCUT_STRICT=1) it comes back empty, and the buffer's
// integrity check refuses to open ("write-ahead log 00001.mem is empty: it
// was cut short") although Badger itself would start a new log in it.
func TestPowerCutRightAfterStart(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	local, _, _, prefix := setup(t)
	ffs := mountPowerCutDisk(t)
	dataDir := powerCutDataDir(t, ffs)
	for range 3 {
		d := startDaemon(t, dataDir, local.Endpoint, prefix)
		require.NoError(t, d.cmd.Process.Kill())
		<-d.exited
		d.exited <- nil
		require.NoError(t, ffs.PowerCut())
	}
	startDaemon(t, dataDir, local.Endpoint, prefix)
}

// mountPowerCutDisk mounts faultfs for a power-cut test, with the Strict
// name model when GATEWAY_POWERCUT_STRICT is set.
func mountPowerCutDisk(t *testing.T) *faultfs.FS {
	t.Helper()
	return faultfs.Mount(t, filepath.Join(t.TempDir(), "disk"), func(o *faultfs.Options) {
		if os.Getenv(envPowerCutStrict) != "" {
			o.Names = faultfs.Strict
		}
	})
}

// powerCutDataDir creates gatewayd's data directory on ffs, durably (as a
// package or an operator would have made it long before).
func powerCutDataDir(t *testing.T, ffs *faultfs.FS) string {
	t.Helper()
	dataDir := filepath.Join(ffs.Dir(), "gateway")
	require.NoError(t, os.Mkdir(dataDir, 0o755))
	root, err := os.Open(ffs.Dir())
	require.NoError(t, err)
	require.NoError(t, root.Sync())
	require.NoError(t, root.Close())
	return dataDir
}
