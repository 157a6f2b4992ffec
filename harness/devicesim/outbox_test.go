package devicesim

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func ids(o *outbox) []string {
	var out []string
	for _, e := range o.entries {
		out = append(out, e.id)
	}
	return out
}

func TestOutboxDropsOldestWhenFull(t *testing.T) {
	o := newOutbox(3)
	for i := range 3 {
		require.Nil(t, o.push(&entry{id: fmt.Sprint(i)}))
	}
	o.markInflight(o.get("0"), time.Unix(10, 0))
	require.Equal(t, 1, o.inflight)

	dropped := o.push(&entry{id: "3"})
	require.NotNil(t, dropped)
	require.Equal(t, "0", dropped.id, "the oldest batch goes first")
	require.Equal(t, 0, o.inflight, "a dropped inflight batch no longer counts")
	dropped = o.push(&entry{id: "4"})
	require.Equal(t, "1", dropped.id)
	require.Equal(t, []string{"2", "3", "4"}, ids(o))
	require.Equal(t, 3, o.len())
	require.Nil(t, o.get("0"), "an ack for a dropped batch finds nothing")
}

func TestOutboxOldestUnsentFirst(t *testing.T) {
	o := newOutbox(10)
	for i := range 4 {
		o.push(&entry{id: fmt.Sprint(i)})
	}
	deadline := time.Unix(100, 0)
	require.Equal(t, "0", o.nextUnsent().id)
	o.markInflight(o.nextUnsent(), deadline)
	require.Equal(t, "1", o.nextUnsent().id)
	o.markInflight(o.nextUnsent(), deadline.Add(time.Second))
	require.Equal(t, 2, o.inflight)

	first, ok := o.earliestDeadline()
	require.True(t, ok)
	require.Equal(t, deadline, first)

	require.True(t, o.remove("1"))
	require.False(t, o.remove("1"))
	require.Equal(t, 1, o.inflight)
	o.release(o.get("0"))
	require.Equal(t, 0, o.inflight)
	require.Equal(t, "0", o.nextUnsent().id, "a released batch is sent again before newer ones")
	_, ok = o.earliestDeadline()
	require.False(t, ok)
	require.Equal(t, []string{"0", "2", "3"}, ids(o))
}

func TestOutboxExpiredAndReleaseAll(t *testing.T) {
	o := newOutbox(10)
	for i := range 3 {
		e := &entry{id: fmt.Sprint(i)}
		o.push(e)
		o.markInflight(e, time.Unix(int64(10*(i+1)), 0))
	}
	require.Empty(t, o.expired(time.Unix(9, 0)))
	got := o.expired(time.Unix(20, 0))
	require.Len(t, got, 2, "deadlines at or before now expire")
	require.Equal(t, "0", got[0].id)
	require.Equal(t, "1", got[1].id)
	require.Equal(t, 1, o.inflight)
	require.Equal(t, 1, o.releaseAll())
	require.Equal(t, 0, o.inflight)
	require.Equal(t, 3, o.len(), "released batches stay in the buffer")
}
