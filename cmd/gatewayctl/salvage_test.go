package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
)

// TestBufferSalvageWithoutTheManifest: inspect refuses a buffer whose
// MANIFEST is gone as gatewayd does, naming salvage, and salvage recovers
// its pending batches and dead letter into a buffer gatewayd opens.
func TestBufferSalvageWithoutTheManifest(t *testing.T) {
	f := newFixture(t, false)
	require.NoError(t, os.Remove(filepath.Join(f.dir, "MANIFEST")))
	_, openErr := buffer.Open(f.dir, buffer.Options{}, nil, nil)
	require.ErrorIs(t, openErr, buffer.ErrDamaged)

	r := ctl(t, nil, "buffer", "inspect", "--data-dir", f.dir)
	require.Equal(t, exitError, r.code)
	require.Contains(t, r.stderr, openErr.Error(), "inspect says what gatewayd says")
	require.Contains(t, r.stderr, "gatewayctl buffer salvage --data-dir "+f.dir+" --out NEWDIR")
	require.NotContains(t, r.stderr, "no buffer at")

	out := filepath.Join(t.TempDir(), "salvaged")
	r = ctl(t, nil, "buffer", "salvage", "--data-dir", f.dir, "--out", out)
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stdout, "recovered: 3 pending batches, 1 dead letters")
	require.Equal(t, f.pending, pendingIDs(t, out))
	r = ctl(t, nil, "buffer", "dead-letters", "--data-dir", out)
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stdout, f.dead)
	require.Contains(t, r.stdout, deadReason)

	r = ctl(t, nil, "buffer", "salvage", "--data-dir", f.dir)
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "--out: missing")
}
