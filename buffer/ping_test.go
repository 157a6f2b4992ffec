package buffer

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPing(t *testing.T) {
	b, err := Open(t.TempDir(), Options{}, nil, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, b.Ping(ctx))
	require.NoError(t, b.Close())
	require.ErrorIs(t, b.Ping(ctx), ErrClosed)
}
