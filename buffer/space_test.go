package buffer

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSpace(t *testing.T) {
	tests := []struct {
		name      string
		free      func() (uint64, bool)
		wantFree  uint64
		wantKnown bool
	}{
		{"free space known", func() (uint64, bool) { return 5 << 30, true }, 5 << 30, true},
		{"free space unreadable", func() (uint64, bool) { return 0, false }, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := Options{MaxPendingBytes: 64 << 20}
			opts.freeBytes = tt.free
			b, err := Open(t.TempDir(), opts, nil, nil)
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, b.Close()) })
			require.NoError(t, b.SaveState("dev/AA:BB:CC:DD:EE:01", []byte(`{"x":1}`)))

			s := b.Space()
			require.Equal(t, int64(64<<20), s.BudgetBytes)
			require.Equal(t, b.Usage().Total(), s.UsedBytes)
			require.Positive(t, s.UsedBytes)
			require.Equal(t, tt.wantFree, s.FreeBytes)
			require.Equal(t, tt.wantKnown, s.FreeKnown)
			require.Equal(t, b.opts.MinFreeBytes, s.MinFreeBytes)
			require.Positive(t, s.MinFreeBytes, "the default watermark applies")
		})
	}
}
