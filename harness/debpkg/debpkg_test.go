package debpkg

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestInstallDoesNothingWhenPresent(t *testing.T) {
	calls := 0
	require.NoError(t, Install(context.Background(), func() bool { calls++; return true }, "no-such-package"))
	require.Equal(t, 1, calls, "asked once, nothing installed")
}

func TestLockFileSerializes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	unlock, err := lockFile(context.Background(), path)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = lockFile(ctx, path)
	require.ErrorIs(t, err, context.DeadlineExceeded, "held by the first")
	require.ErrorContains(t, err, "another install running")

	unlock()
	unlock2, err := lockFile(context.Background(), path)
	require.NoError(t, err, "free again")
	unlock2()
}
