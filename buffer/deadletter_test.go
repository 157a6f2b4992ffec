package buffer

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

func TestDeadLetterLeavesQueueButKeepsBatch(t *testing.T) {
	b := open(t, t.TempDir(), Options{})
	_, err := b.Commit(context.Background(), []Entry{entry("a", "1")})
	require.NoError(t, err)
	pend, err := b.Pending(0, 10)
	require.NoError(t, err)
	require.NoError(t, b.DeadLetter(pend[0], "ValidationException"))
	require.Zero(t, b.Stats().PendingBatches)
	state, err := b.Lookup("a")
	require.NoError(t, err)
	require.Equal(t, "dead", state)
	out, err := b.Commit(context.Background(), []Entry{entry("a", "1")})
	require.NoError(t, err)
	require.Equal(t, []Outcome{Duplicate}, out)
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
