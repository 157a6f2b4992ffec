package syncbuf

import (
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBufferKeepsEverythingByDefault(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				n, err := b.Write([]byte("abc\n"))
				require.NoError(t, err)
				require.Equal(t, 4, n)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, strings.Repeat("abc\n", 800), b.String())
}

func TestBufferKeepsTheLastMaxBytes(t *testing.T) {
	b := Buffer{Max: 5}
	_, _ = b.Write([]byte("0123"))
	require.Equal(t, "0123", b.String())
	n, err := b.Write([]byte("4567"))
	require.NoError(t, err)
	require.Equal(t, 4, n, "a write reports all of p, even what is dropped")
	require.Equal(t, "34567", b.String())
	_, _ = b.Write([]byte("abcdefgh"))
	require.Equal(t, "defgh", b.String())
}

// The tail dynamotest keeps of DynamoDB Local's output.
func TestBufferTailAcrossWrites(t *testing.T) {
	b := &Buffer{Max: 8}
	for _, s := range []string{"0123", "4567", "89ab"} {
		n, err := b.Write([]byte(s))
		require.NoError(t, err)
		require.Equal(t, len(s), n)
	}
	require.Equal(t, "456789ab", b.String())
}
