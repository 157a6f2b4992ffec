package main

import (
	"fmt"
	"syscall"
	"testing"

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
	env := []string{fmt.Sprintf("GATEWAY_BUFFER_MEMTABLE_SIZE=%d", diskMemTable),
		fmt.Sprintf("GATEWAY_BUFFER_MIN_FREE_BYTES=%d", buffer.RequiredFreeBytes(diskMemTable))}
	// A 1 MiB memtable holds a few hundred of these batches: 5,000 rotate
	// (and flush) it several times over.
	failingDiskRounds(t, "02:00:00:00:D1:C0", env, 5000,
		diskFault{faultfs.Rule{Op: faultfs.OpCreate, Path: "*.mem", Err: syscall.EPERM}, "operation not permitted"},
		diskFault{faultfs.Rule{Op: faultfs.OpCreate, Path: "*.sst", Err: syscall.EPERM}, "operation not permitted"})
}
