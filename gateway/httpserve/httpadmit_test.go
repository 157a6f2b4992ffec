package httpserve

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/harness/syncbuf"
)

// admitServer is an http.Server behind the admission listener whose
// handler, for a request with "X-Mode: block", waits until release is
// closed.
type admitServer struct {
	addr    string
	adm     *admission
	logs    *syncbuf.Buffer
	entered chan struct{}
	release chan struct{}
}

func startAdmitServer(t *testing.T, maxConns, maxPerAddr int) *admitServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	logs := &syncbuf.Buffer{}
	s := &admitServer{addr: l.Addr().String(), logs: logs, entered: make(chan struct{}, 16), release: make(chan struct{}),
		adm: newAdmission(maxConns, maxPerAddr, slog.New(slog.NewTextHandler(logs, nil)), prometheus.NewRegistry())}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Mode") == "block" {
			s.entered <- struct{}{}
			<-s.release
		}
		_, _ = io.WriteString(w, "done")
	})
	srv := &http.Server{Handler: inHandler(handler), ConnContext: connContext, ReadHeaderTimeout: time.Minute}
	go func() { _ = srv.Serve(admitListener{Listener: l, adm: s.adm}) }()
	t.Cleanup(func() {
		select {
		case <-s.release:
		default:
			close(s.release)
		}
		_ = srv.Close()
	})
	return s
}

// open is the number of connections the admission tracks.
func (s *admitServer) open() int {
	s.adm.mu.Lock()
	defer s.adm.mu.Unlock()
	return s.adm.open
}

// waitOpen waits until the admission tracks n connections.
func (s *admitServer) waitOpen(t *testing.T, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return s.open() == n }, 10*time.Second, 5*time.Millisecond,
		"want %d open connections", n)
}

// half dials from src and sends half a request.
func (s *admitServer) half(t *testing.T, src string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", s.addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nX-Mode: ")
	require.NoError(t, err)
	return c
}

// requireClosed asserts that the server closed c.
func requireClosed(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err := c.Read(make([]byte, 1))
	require.Error(t, err, msg)
	require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "%s: still open after 10s", msg)
}

// requireOpen asserts that the server has not closed c.
func requireOpen(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
	_, err := c.Read(make([]byte, 1))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, msg)
}

func TestAdmissionShedsTheLongestWaitingConnection(t *testing.T) {
	s := startAdmitServer(t, 3, 3)
	c1 := s.half(t, "127.0.0.2")
	s.waitOpen(t, 1)
	c2 := s.half(t, "127.0.0.3")
	s.waitOpen(t, 2)
	c3 := s.half(t, "127.0.0.4")
	s.waitOpen(t, 3)
	c4 := s.half(t, "127.0.0.5")
	requireClosed(t, c1, "the oldest waiting connection is shed")
	requireOpen(t, c2, "c2")
	requireOpen(t, c3, "c3")
	requireOpen(t, c4, "the newcomer")
	require.Equal(t, 3, s.open())
	require.Equal(t, 1.0, testutil.ToFloat64(s.adm.shed.WithLabelValues(admitTotalCap)))
	require.Equal(t, 0.0, testutil.ToFloat64(s.adm.refused.WithLabelValues(admitTotalCap)))
	require.Equal(t, 3.0, testutil.ToFloat64(s.adm.openGauge))
	require.Contains(t, s.logs.String(), "HTTP connection caps reached")
	require.Contains(t, s.logs.String(), "shed_total_cap=1")

	s.half(t, "127.0.0.6")
	requireClosed(t, c2, "the next oldest")
	require.Equal(t, 1, strings.Count(s.logs.String(), "caps reached"), "one log line a minute at most")
}

// inFlight sends a request that blocks in the handler and waits until
// the handler runs.
func (s *admitServer) inFlight(t *testing.T, src string) net.Conn {
	t.Helper()
	c := s.half(t, src)
	_, err := io.WriteString(c, "block\r\n\r\n")
	require.NoError(t, err)
	select {
	case <-s.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not start")
	}
	return c
}

func TestAdmissionNeverShedsAConnectionInAHandler(t *testing.T) {
	s := startAdmitServer(t, 2, 2)
	busy := s.inFlight(t, "127.0.0.2")
	s.waitOpen(t, 1)
	w1 := s.half(t, "127.0.0.2")
	s.waitOpen(t, 2)
	w2 := s.half(t, "127.0.0.3")
	requireClosed(t, w1, "the waiting connection goes, not the older one in a handler")
	requireOpen(t, w2, "the newcomer stays")

	// Both slots inside a handler: a newcomer is closed at once.
	w2.Close()
	s.waitOpen(t, 1)
	busy2 := s.inFlight(t, "127.0.0.3")
	s.waitOpen(t, 2)
	refused := s.half(t, "127.0.0.4")
	requireClosed(t, refused, "every connection is in a handler: the newcomer is refused")
	require.Equal(t, 1.0, testutil.ToFloat64(s.adm.refused.WithLabelValues(admitTotalCap)))
	require.Equal(t, 2, s.open())

	close(s.release)
	for _, c := range []net.Conn{busy, busy2} {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "the requests in handlers are answered")
		resp.Body.Close()
	}
}

func TestAdmissionAnIdleKeepAliveWaitsFromItsLastRequest(t *testing.T) {
	s := startAdmitServer(t, 2, 2)
	keepAlive := s.half(t, "127.0.0.2")
	s.waitOpen(t, 1)
	slow := s.half(t, "127.0.0.3")
	s.waitOpen(t, 2)
	// keepAlive finishes its request after slow was accepted: it is now
	// the one that has waited least.
	_, err := io.WriteString(keepAlive, "fast\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(keepAlive), nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp.Body.Close()
	require.Eventually(t, func() bool {
		s.adm.mu.Lock()
		defer s.adm.mu.Unlock()
		return s.adm.waiting.Back() != nil && s.adm.waiting.Back().Value.(*admitConn).RemoteAddr().String() == keepAlive.LocalAddr().String()
	}, 10*time.Second, 5*time.Millisecond)
	newcomer := s.half(t, "127.0.0.4")
	requireClosed(t, slow, "the half request waited longest")
	requireOpen(t, keepAlive, "the idle keep-alive connection stays")
	requireOpen(t, newcomer, "the newcomer stays")
}

func TestAdmissionPerAddressCap(t *testing.T) {
	s := startAdmitServer(t, 10, 2)
	a1 := s.half(t, "127.0.0.2")
	s.waitOpen(t, 1)
	other := s.half(t, "127.0.0.3")
	s.waitOpen(t, 2)
	a2 := s.half(t, "127.0.0.2")
	s.waitOpen(t, 3)
	a3 := s.half(t, "127.0.0.2")
	requireClosed(t, a1, "the address's oldest waiting connection is shed")
	requireOpen(t, other, "another address's older connection stays")
	requireOpen(t, a2, "a2")
	requireOpen(t, a3, "a3")
	require.Equal(t, 1.0, testutil.ToFloat64(s.adm.shed.WithLabelValues(admitAddressCap)))
	require.Equal(t, 0.0, testutil.ToFloat64(s.adm.shed.WithLabelValues(admitTotalCap)))

	// Both of the address's slots in handlers: its newcomer is refused,
	// while another address still gets in.
	a2.Close()
	a3.Close()
	s.waitOpen(t, 1)
	s.inFlight(t, "127.0.0.2")
	s.inFlight(t, "127.0.0.2")
	s.waitOpen(t, 3)
	requireClosed(t, s.half(t, "127.0.0.2"), "the address's slots are all in handlers")
	require.Equal(t, 1.0, testutil.ToFloat64(s.adm.refused.WithLabelValues(admitAddressCap)))
	requireOpen(t, s.half(t, "127.0.0.4"), "another address is admitted")
}

// fakeConn is a connection with a given remote address.
type fakeConn struct {
	net.Conn
	remote net.Addr
	closed bool
}

func (c *fakeConn) RemoteAddr() net.Addr { return c.remote }
func (c *fakeConn) Close() error         { c.closed = true; return nil }

func TestAdmissionCountsAnIPv6SlashSixtyFourAsOneSource(t *testing.T) {
	a := newAdmission(10, 2, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	conn := func(s string) *fakeConn {
		return &fakeConn{remote: net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s))}
	}
	first, second, third := conn("[2001:db8::1]:1000"), conn("[2001:db8::2]:1000"), conn("[2001:db8::ffff:3]:1000")
	elsewhere := conn("[2001:db8:0:1::1]:1000")
	for _, c := range []*fakeConn{first, second, elsewhere, third} {
		require.NotNil(t, a.admit(c))
	}
	require.True(t, first.closed, "three hosts of one /64 share its cap of 2")
	require.False(t, second.closed)
	require.False(t, third.closed)
	require.False(t, elsewhere.closed, "another /64 is another source")
	require.Equal(t, 1.0, testutil.ToFloat64(a.shed.WithLabelValues(admitAddressCap)))
}

func TestAdmissionForgetsClosedConnections(t *testing.T) {
	s := startAdmitServer(t, 16, 4)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			src := fmt.Sprintf("127.0.0.%d", 2+i)
			for range 25 {
				d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
				c, err := d.Dial("tcp", s.addr)
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
				if i%2 == 0 { // half the clients read their answer
					_, _ = http.ReadResponse(bufio.NewReader(c), nil)
				}
				c.Close()
			}
		})
	}
	wg.Wait()
	s.waitOpen(t, 0)
	s.adm.mu.Lock()
	defer s.adm.mu.Unlock()
	require.Zero(t, s.adm.waiting.Len())
	require.Empty(t, s.adm.sources, "no source outlives its connections")
	require.Zero(t, testutil.ToFloat64(s.adm.openGauge))
}
