package broker

import (
	"errors"
	"log/slog"
	"net"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// flakyListener fails its first Accepts with errs, then accepts from l.
type flakyListener struct {
	net.Listener
	errs []error
}

func (f *flakyListener) Accept() (net.Conn, error) {
	if len(f.errs) > 0 {
		err := f.errs[0]
		f.errs = f.errs[1:]
		return nil, err
	}
	return f.Listener.Accept()
}

// TestGuardAcceptRetriesErrors checks that an accept error (out of file
// descriptors, say) does not end the listener, which would stop mochi from
// accepting for good, while a closed listener does end it.
func TestGuardAcceptRetriesErrors(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	emfile := &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}
	g := &guardListener{Listener: &flakyListener{Listener: l, errs: []error{emfile, emfile}}, timeout: defaultConnectTimeout,
		adm: newMQTTAdmission(8, 8), logger: slog.New(slog.DiscardHandler), refused: func(string) {}}
	c, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	got, err := g.Accept()
	require.NoError(t, err, "accept errors are retried")
	require.NoError(t, got.Close())

	require.NoError(t, l.Close())
	_, err = g.Accept()
	require.True(t, errors.Is(err, net.ErrClosed), "a closed listener ends Accept: %v", err)
}
