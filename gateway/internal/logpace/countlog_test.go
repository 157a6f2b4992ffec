package logpace

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCountLogOneLinePerInterval(t *testing.T) {
	now := time.Unix(1000, 0)
	l := New(time.Minute)
	l.now = func() time.Time { return now }

	require.Equal(t, map[string]int{"a": 1}, l.Add("a"), "the first event is logged at once")
	require.Nil(t, l.Add("a"))
	require.Nil(t, l.Add("b"))
	now = now.Add(59 * time.Second)
	require.Nil(t, l.Add("a"))
	now = now.Add(time.Second)
	require.Equal(t, map[string]int{"a": 3, "b": 1}, l.Add("a"), "everything since the last line")
	require.Nil(t, l.Add("b"))
	now = now.Add(time.Hour)
	require.Equal(t, map[string]int{"b": 2}, l.Add("b"))

	l.Count("c") // counted under another lock, logged later
	l.Count("c")
	require.Nil(t, l.Take())
	now = now.Add(time.Minute)
	require.Equal(t, map[string]int{"c": 2}, l.Take())
	require.Nil(t, l.Take())
}
