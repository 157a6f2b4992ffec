//go:build unix

package mosquittotest

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPubSubAndRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts mosquitto")
	}
	b := Start(t)
	require.True(t, strings.HasPrefix(b.URL(), "tcp://127.0.0.1:"))
	require.NotEqual(t, "127.0.0.1:1883", b.Addr())

	sub, err := Sub(t, b.URL(), "t/+", 1, "", "")
	require.NoError(t, err)
	payload := []byte("two\nlines and \x00 bytes")
	require.NoError(t, Pub(t, b.URL(), "t/a", 1, payload, "", ""))
	m, err := sub.Next(5 * time.Second)
	require.NoError(t, err)
	require.Equal(t, Message{Topic: "t/a", Payload: payload}, m)

	b.Restart(t)
	conn, err := net.DialTimeout("tcp", b.Addr(), time.Second)
	require.NoError(t, err, "the same port after a restart")
	require.NoError(t, conn.Close())
	sub, err = Sub(t, b.URL(), "t/b", 0, "", "")
	require.NoError(t, err)
	require.NoError(t, Pub(t, b.URL(), "t/b", 0, []byte("after"), "", ""))
	m, err = sub.Next(5 * time.Second)
	require.NoError(t, err)
	require.Equal(t, "after", string(m.Payload))

	b.Stop(t)
	_, err = net.DialTimeout("tcp", b.Addr(), time.Second)
	require.Error(t, err, "stopped")
	b.Stop(t) // idempotent
	require.Error(t, Pub(t, b.URL(), "t/b", 1, []byte("x"), "", ""), "no broker")
}
