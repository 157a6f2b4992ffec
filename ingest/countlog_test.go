package ingest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCountLogOneLinePerInterval(t *testing.T) {
	now := time.Unix(1000, 0)
	l := newCountLog(time.Minute)
	l.now = func() time.Time { return now }

	require.Equal(t, map[string]int{"a": 1}, l.add("a"), "the first event is logged at once")
	require.Nil(t, l.add("a"))
	require.Nil(t, l.add("b"))
	now = now.Add(59 * time.Second)
	require.Nil(t, l.add("a"))
	now = now.Add(time.Second)
	require.Equal(t, map[string]int{"a": 3, "b": 1}, l.add("a"), "everything since the last line")
	require.Nil(t, l.add("b"))
	now = now.Add(time.Hour)
	require.Equal(t, map[string]int{"b": 2}, l.add("b"))

	l.count("c") // counted under another lock, logged later
	l.count("c")
	require.Nil(t, l.take())
	now = now.Add(time.Minute)
	require.Equal(t, map[string]int{"c": 2}, l.take())
	require.Nil(t, l.take())
}
