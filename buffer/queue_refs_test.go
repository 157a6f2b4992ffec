package buffer

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPendingRefsMatchPendingWithoutPayloads(t *testing.T) {
	b := open(t, t.TempDir(), Options{})
	var entries []Entry
	for i := range 10 {
		e := entry(fmt.Sprintf("batch-%02d", i), fmt.Sprintf(`{"n":%d}`, i))
		e.HardwareID = fmt.Sprintf("AA:BB:CC:DD:EE:%02X", i%3)
		entries = append(entries, e)
	}
	_, err := b.Commit(context.Background(), entries)
	require.NoError(t, err)
	all, err := b.Pending(0, 100)
	require.NoError(t, err)
	require.NoError(t, b.MarkDelivered(all[:2]))

	tests := []struct {
		name  string
		after uint64
		limit int
		want  []Pending
	}{
		{"from the start", 0, 100, all[2:]},
		{"limited", 0, 3, all[2:5]},
		{"after a sequence number", all[6].Seq, 100, all[7:]},
		{"past the end", all[9].Seq, 100, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			refs, err := b.PendingRefs(tt.after, tt.limit)
			require.NoError(t, err)
			require.Len(t, refs, len(tt.want))
			for i, r := range refs {
				w := tt.want[i]
				require.Equal(t, w.Seq, r.Seq)
				require.Equal(t, w.BatchID, r.BatchID)
				require.Equal(t, w.HardwareID, r.HardwareID)
				require.True(t, w.ReceivedAt.Equal(r.ReceivedAt))
				require.Nil(t, r.Payload)
			}
		})
	}
	require.NoError(t, b.Close())
	_, err = b.PendingRefs(0, 1)
	require.ErrorIs(t, err, ErrClosed)
}
