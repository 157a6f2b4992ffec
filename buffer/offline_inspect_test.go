package buffer

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
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

func deadLetterByID(tb testing.TB, b *Buffer, id, reason string) {
	tb.Helper()
	ps, err := b.Pending(0, 100)
	require.NoError(tb, err)
	for _, p := range ps {
		if p.BatchID == id {
			require.NoError(tb, b.DeadLetter(p, reason))
			return
		}
	}
	tb.Fatalf("batch %s is not pending", id)
}

func TestReforwardRequeuesAtTheEnd(t *testing.T) {
	dir := t.TempDir()
	reg := prometheus.NewRegistry()
	b, err := Open(dir, Options{}, nil, reg)
	require.NoError(t, err)
	ctx := context.Background()
	_, err = b.Commit(ctx, []Entry{entryOf("a", "HW1", `{"n":1}`), entryOf("b", "HW1", `{"n":2}`), entryOf("c", "HW2", `{"n":3}`)})
	require.NoError(t, err)
	deadLetterByID(t, b, "b", "ValidationException: One or more parameter values were invalid")
	require.Equal(t, []string{"a", "c"}, pendingIDs(t, b))

	dls, total, err := b.DeadLetters(0)
	require.NoError(t, err)
	require.Equal(t, 1, total)
	require.Len(t, dls, 1)
	require.Equal(t, "b", dls[0].BatchID)
	require.Equal(t, "HW1", dls[0].HardwareID)
	require.Equal(t, "ValidationException: One or more parameter values were invalid", dls[0].Reason)
	require.Equal(t, len(`{"n":2}`), dls[0].PayloadBytes)
	require.False(t, dls[0].DeadLetteredAt.IsZero())
	requireCountersMatchDisk(t, b)

	// Drain the notification the commit left, so the next one is
	// Reforward's.
	select {
	case <-b.Notify():
	default:
	}
	p, err := b.Reforward("b")
	require.NoError(t, err)
	require.Equal(t, "b", p.BatchID)
	require.Equal(t, []byte(`{"n":2}`), p.Payload)
	select {
	case <-b.Notify():
	default:
		t.Fatal("Reforward did not notify the uplink")
	}

	require.Equal(t, []string{"a", "c", "b"}, pendingIDs(t, b), "re-forwarded at the end of the queue")
	ps, err := b.Pending(0, 100)
	require.NoError(t, err)
	require.Equal(t, p.Seq, ps[2].Seq)
	require.Equal(t, []byte(`{"n":2}`), ps[2].Payload)
	state, err := b.Lookup("b")
	require.NoError(t, err)
	require.Equal(t, "pending", state)
	dls, total, err = b.DeadLetters(0)
	require.NoError(t, err)
	require.Zero(t, total)
	require.Empty(t, dls)
	require.Equal(t, int64(3), b.Stats().PendingBatches)
	require.Zero(t, b.Usage().Dead)
	require.Zero(t, b.Usage().DeadBatches)
	requireCountersMatchDisk(t, b)
	require.Equal(t, 1.0, testutil.ToFloat64(b.metrics.reforwarded))
	require.Equal(t, 1.0, testutil.ToFloat64(b.metrics.deadLettered), "the dead-lettered counter is a history")

	// The re-forwarded batch is delivered like any other, and a resend of
	// it is a duplicate.
	require.NoError(t, b.MarkDelivered(ps))
	got, err := b.Commit(ctx, []Entry{entryOf("b", "HW1", `{"n":2}`)})
	require.NoError(t, err)
	require.Equal(t, []Outcome{Duplicate}, got)
	requireCountersMatchDisk(t, b)
	usage := b.Usage()
	require.NoError(t, b.Close())

	// Everything survives a reopen, which checks the clean-shutdown counts.
	b = open(t, dir, Options{})
	require.Equal(t, usage, b.Usage())
	require.Empty(t, pendingIDs(t, b))
	requireCountersMatchDisk(t, b)
}

func TestReforwardSurvivesReopenBeforeDelivery(t *testing.T) {
	dir := t.TempDir()
	b, err := Open(dir, Options{}, nil, nil)
	require.NoError(t, err)
	_, err = b.Commit(context.Background(), []Entry{entryOf("a", "HW1", `{"n":1}`), entryOf("b", "HW1", `{"n":2}`)})
	require.NoError(t, err)
	deadLetterByID(t, b, "a", "refused")
	_, err = b.Reforward("a")
	require.NoError(t, err)
	require.NoError(t, b.Close())

	b = open(t, dir, Options{})
	require.Equal(t, []string{"b", "a"}, pendingIDs(t, b))
	requireCountersMatchDisk(t, b)
	// New batches go after the re-forwarded one.
	_, err = b.Commit(context.Background(), []Entry{entryOf("c", "HW1", `{"n":3}`)})
	require.NoError(t, err)
	require.Equal(t, []string{"b", "a", "c"}, pendingIDs(t, b))
}

func TestReforwardRefuses(t *testing.T) {
	b := open(t, t.TempDir(), Options{})
	_, err := b.Commit(context.Background(), []Entry{entryOf("queued", "HW1", `{}`), entryOf("sent", "HW1", `{}`),
		entryOf("dead", "HW1", `{}`)})
	require.NoError(t, err)
	ps, err := b.Pending(0, 10)
	require.NoError(t, err)
	require.NoError(t, b.MarkDelivered(ps[1:2]))
	require.NoError(t, b.DeadLetter(ps[2], "refused"))
	_, err = b.Reforward("dead")
	require.NoError(t, err)

	tests := []struct {
		id   string
		is   error
		want string
	}{
		{"nope", ErrNotFound, "nope"},
		{"queued", ErrNotDeadLettered, "queued is pending"},
		{"sent", ErrNotDeadLettered, "sent was delivered at"},
		{"dead", ErrNotDeadLettered, "dead is pending"},
	}
	before := b.Usage()
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			_, err := b.Reforward(tt.id)
			require.ErrorIs(t, err, tt.is)
			require.ErrorContains(t, err, tt.want)
		})
	}
	require.Equal(t, before, b.Usage())
	requireCountersMatchDisk(t, b)
	require.NoError(t, b.Close())
	_, err = b.Reforward("dead")
	require.ErrorIs(t, err, ErrClosed)
}

func TestDeadLetterEncoding(t *testing.T) {
	p := Pending{BatchID: "AA:BB:CC:DD:EE:FF-1", HardwareID: "AA:BB:CC:DD:EE:FF",
		ReceivedAt: time.UnixMilli(1_700_000_000_000), Payload: []byte(`{"batch_id":"x"}`)}
	tests := []struct {
		name       string
		val        []byte
		wantReason string
	}{
		{"with a reason", encodeDead(p, "ValidationException"), "ValidationException"},
		{"without a reason", encodeDead(p, ""), ""},
		{"written before reasons were kept", encodePending(p), ""},
		{"long reason is cut at a rune", encodeDead(p, strings.Repeat("é", 600)), strings.Repeat("é", 512)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, reason, err := decodeDead(tt.val, true)
			require.NoError(t, err)
			require.Equal(t, tt.wantReason, reason)
			require.Equal(t, p.Payload, got.Payload)
			require.Equal(t, p.BatchID, got.BatchID)
			require.Equal(t, p.HardwareID, got.HardwareID)
			require.True(t, p.ReceivedAt.Equal(got.ReceivedAt))
		})
	}
	_, _, err := decodeDead(encodeDead(Pending{BatchID: "a"}, "why"), true)
	require.ErrorContains(t, err, "no payload")
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
