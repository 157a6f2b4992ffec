package listen

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestTCPDefersSilentSockets checks that a connection that has sent
// nothing does not reach Accept, and that one that sends reaches it with
// its bytes although it connected later.
func TestTCPDefersSilentSockets(t *testing.T) {
	l, err := TCP("127.0.0.1:0", 10*time.Second)
	require.NoError(t, err)
	defer l.Close()
	silent, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err, "the client's handshake completes")
	defer silent.Close()
	speaker, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	defer speaker.Close()
	_, err = speaker.Write([]byte{0x10})
	require.NoError(t, err)

	c, err := l.Accept()
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, speaker.LocalAddr().String(), c.RemoteAddr().String(), "the connection that spoke comes first")
	buf := make([]byte, 1)
	_, err = c.Read(buf)
	require.NoError(t, err)
	require.Equal(t, byte(0x10), buf[0])

	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	select {
	case c := <-accepted:
		c.Close()
		t.Fatal("a connection that sent nothing was accepted")
	case <-time.After(500 * time.Millisecond):
	}
}
