package buffer

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func entryOf(id, hw, payload string) Entry {
	e := entry(id, payload)
	e.HardwareID = hw
	return e
}

// requireCountersMatchDisk checks the running counters against a fresh
// scan of every record.
func requireCountersMatchDisk(tb testing.TB, b *Buffer) {
	tb.Helper()
	s, err := b.scan()
	require.NoError(tb, err)
	require.Equal(tb, s.usage, b.Usage())
	require.Equal(tb, s.pendingBatches, b.Stats().PendingBatches)
	require.Equal(tb, s.pendingBytes, b.Stats().PendingBytes)
	require.Equal(tb, s.nextSeq, b.nextSeq)
}

// snapshotFixture is a cleanly closed buffer with two devices' pending
// batches, a delivered one, a dead letter and a state record.
func snapshotFixture(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	b, err := Open(dir, Options{}, nil, nil)
	require.NoError(t, err)
	e := func(id, hw string, ms int64) Entry {
		x := entryOf(id, hw, `{"batch_id":"`+id+`"}`)
		x.ReceivedAt = time.UnixMilli(ms)
		return x
	}
	_, err = b.Commit(context.Background(), []Entry{e("a1", "HW-A", 1_000), e("a2", "HW-A", 2_000),
		e("b1", "HW-B", 3_000), e("a3", "HW-A", 4_000), e("b2", "HW-B", 5_000)})
	require.NoError(t, err)
	ps, err := b.Pending(0, 10)
	require.NoError(t, err)
	require.NoError(t, b.MarkDelivered(ps[:1]))
	require.NoError(t, b.DeadLetter(ps[2], "ValidationException: item too large"))
	require.NoError(t, b.SaveState("keys", []byte("0123456789")))
	require.NoError(t, b.Close())
	return dir
}

func TestSnapshotInspects(t *testing.T) {
	dir := snapshotFixture(t)
	s, err := OpenSnapshot(dir, nil)
	require.NoError(t, err)
	require.Empty(t, s.Note)
	in, err := s.Inspect(1, 0)
	require.NoError(t, err)
	require.NoError(t, s.Close())

	require.True(t, in.CleanShutdown)
	require.Equal(t, int64(3), in.PendingBatches)
	require.Equal(t, time.UnixMilli(2_000), in.OldestPending)
	require.Equal(t, time.UnixMilli(5_000), in.NewestPending)
	require.Equal(t, 2, in.DeviceCount)
	require.Len(t, in.Devices, 1, "top 1")
	require.Equal(t, "HW-A", in.Devices[0].HardwareID)
	require.Equal(t, int64(2), in.Devices[0].Batches)
	require.Equal(t, int64(1), in.DeliveredMarkers)
	require.False(t, in.OldestDelivery.IsZero())
	require.Equal(t, int64(1), in.DeadBatches)
	require.Len(t, in.DeadLetters, 1)
	require.Equal(t, "b1", in.DeadLetters[0].BatchID)
	require.Equal(t, "ValidationException: item too large", in.DeadLetters[0].Reason)
	require.Equal(t, []StateRecord{{Name: "keys", Bytes: 10}}, in.StateRecords)
	require.Positive(t, in.Files["tables"]+in.Files["write_ahead_log"])
	require.Equal(t, in.Usage.Total(), in.Usage.Pending+in.Usage.Delivered+in.Usage.Dead+in.Usage.State)
	require.Positive(t, in.Usage.Dead)

	// The read-only snapshot left the directory as it was: the gateway
	// opens it and its clean-shutdown counts still match.
	require.FileExists(t, filepath.Join(dir, cleanRecordName))
	b := open(t, dir, Options{})
	require.Equal(t, in.Usage, b.Usage())
}

func TestSnapshotBatches(t *testing.T) {
	dir := snapshotFixture(t)
	s, err := OpenSnapshot(dir, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close()) }()

	collect := func(what, hw string) []string {
		var got []string
		require.NoError(t, s.Batches(what, hw, func(b Batch) error {
			var payload struct {
				BatchID string `json:"batch_id"`
			}
			require.NoError(t, json.Unmarshal(b.Payload, &payload))
			require.Equal(t, b.BatchID, payload.BatchID)
			got = append(got, b.State+":"+b.BatchID)
			if b.State == StateDead {
				require.Equal(t, "ValidationException: item too large", b.Reason)
				require.False(t, b.DeadLetteredAt.IsZero())
			}
			return nil
		}))
		return got
	}
	require.Equal(t, []string{"pending:a2", "pending:a3", "pending:b2"}, collect(StatePending, ""))
	require.Equal(t, []string{"dead:b1"}, collect(StateDead, ""))
	require.Equal(t, []string{"pending:a2", "pending:a3", "pending:b2", "dead:b1"}, collect(StateAll, ""))
	require.Equal(t, []string{"pending:b2", "dead:b1"}, collect(StateAll, "HW-B"))
	require.Empty(t, collect(StateAll, "HW-C"))
	require.ErrorContains(t, s.Batches("delivered", "", func(Batch) error { return nil }), `"delivered" is not one of`)
}

func TestSnapshotRefusesADirectoryInUse(t *testing.T) {
	b := open(t, t.TempDir(), Options{})
	_, err := OpenSnapshot(b.dir, nil)
	require.ErrorIs(t, err, ErrInUse)
	require.NotErrorIs(t, err, ErrDamaged)
	var inUse *InUseError
	require.ErrorAs(t, err, &inUse)
	require.Equal(t, b.dir, inUse.Dir)
}

func TestSnapshotOfACrashedBuffer(t *testing.T) {
	dir, _ := crashedBuffer(t, 20, 100)
	s, err := OpenSnapshot(dir, nil)
	require.NoError(t, err)
	require.Contains(t, s.Note, "did not stop cleanly")
	in, err := s.Inspect(0, 0)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.False(t, in.CleanShutdown)
	require.Equal(t, int64(20), in.PendingBatches)
	requireOpens(t, dir, 20)
}

func TestSnapshotRefusesDamageAndMissingBuffers(t *testing.T) {
	_, err := OpenSnapshot(filepath.Join(t.TempDir(), "nowhere"), nil)
	require.ErrorContains(t, err, "no buffer at")

	dir := closedBuffer(t, 10, 100)
	require.NoError(t, os.WriteFile(filepath.Join(dir, cleanRecordName),
		[]byte(`{"seq":11,"pending_batches":12,"delivered_markers":0,"dead_batches":0,"state_records":0}`), 0o600))
	_, err = OpenSnapshot(dir, nil)
	require.ErrorIs(t, err, ErrDamaged)
	require.ErrorContains(t, err, "closed cleanly holding 12 pending batches")
}
