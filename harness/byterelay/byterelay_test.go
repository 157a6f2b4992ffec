package byterelay

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// countedConn counts, on the client's side, what crosses a connection.
type countedConn struct {
	net.Conn
	read, written *atomic.Int64
}

func (c countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

func (c countedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	return n, err
}

func TestRelayCountsBytesConnectionsAndRequests(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		_, _ = w.Write([]byte(strings.ToUpper(string(body))))
	}))
	defer srv.Close()
	relay, err := Start(strings.TrimPrefix(srv.URL, "http://"))
	require.NoError(t, err)
	defer func() { require.NoError(t, relay.Close()) }()

	var read, written atomic.Int64
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countedConn{Conn: c, read: &read, written: &written}, nil
	}}
	client := &http.Client{Transport: tr}
	target := ""
	post := func(body io.Reader) {
		req, err := http.NewRequest(http.MethodPost, relay.URL()+"/x", body)
		require.NoError(t, err)
		req.Header.Set("Content-Type", "text/plain")
		if target != "" {
			req.Header.Set("X-Amz-Target", target)
		}
		resp, err := client.Do(req)
		require.NoError(t, err)
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	// Keep-alive requests, with a body of a known length and a chunked one
	// (an io.Reader of unknown length), on one connection; then a second
	// connection.
	for range 5 {
		target = "DynamoDB_20120810.BatchWriteItem"
		post(strings.NewReader(strings.Repeat("reading ", 500)))
		target = ""
		post(io.MultiReader(strings.NewReader("chunked "), strings.NewReader(strings.Repeat("body ", 3000))))
	}
	tr.CloseIdleConnections()
	post(strings.NewReader("last"))
	tr.CloseIdleConnections()

	require.Eventually(t, func() bool {
		c := relay.Counts()
		return c.Requests == 11 && c.Up == written.Load() && c.Down == read.Load()
	}, 5*time.Second, 10*time.Millisecond, "counts %+v, client wrote %d, read %d", relay.Counts(), written.Load(), read.Load())
	c := relay.Counts()
	require.Equal(t, int64(2), c.Connections)
	require.Zero(t, c.Unparsed)
	require.Equal(t, c.Up, relay.Up())
	require.Equal(t, c.Down, relay.Down())
	require.Equal(t, c.Connections, relay.Connections())
	require.Equal(t, c.Requests, relay.Requests())
	// Every byte up is a request's: by operation they add up to Up.
	ops := relay.Operations()
	require.Len(t, ops, 2)
	require.Equal(t, int64(5), ops["DynamoDB_20120810.BatchWriteItem"].Requests)
	require.Equal(t, int64(6), ops[""].Requests)
	require.Greater(t, ops["DynamoDB_20120810.BatchWriteItem"].Up, int64(5*4000))
	require.Equal(t, c.Up, ops["DynamoDB_20120810.BatchWriteItem"].Up+ops[""].Up)

	before, opsBefore := c, ops
	post(strings.NewReader("one more"))
	require.Eventually(t, func() bool { return relay.Requests() == 12 }, 5*time.Second, 10*time.Millisecond)
	d := relay.Counts().Sub(before)
	require.Equal(t, int64(1), d.Requests)
	require.Equal(t, int64(1), d.Connections)
	require.Positive(t, d.Up)
	require.Equal(t, relay.Counts(), before.Add(d))
	dOps := relay.Operations().Sub(opsBefore)
	require.Equal(t, Operations{"": {Requests: 1, Up: d.Up}}, dOps)
}

func TestRelayCountsAStreamThatIsNotHTTP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c) // echo
	}()
	relay, err := Start(ln.Addr().String())
	require.NoError(t, err)
	c, err := net.Dial("tcp", relay.Addr())
	require.NoError(t, err)
	msg := []byte("\x16\x03\x01 not a request line\r\n\r\n")
	_, err = c.Write(msg)
	require.NoError(t, err)
	back := make([]byte, len(msg))
	_, err = io.ReadFull(c, back)
	require.NoError(t, err)
	require.Equal(t, msg, back)
	require.NoError(t, c.Close())
	require.Eventually(t, func() bool {
		n := relay.Counts()
		return n.Up == int64(len(msg)) && n.Down == int64(len(msg)) && n.Unparsed == 1
	}, 5*time.Second, 10*time.Millisecond, "%+v", relay.Counts())
	require.Zero(t, relay.Requests())
	require.NoError(t, relay.Close())
}

func TestCloseEndsOpenConnections(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	relay, err := Start(strings.TrimPrefix(srv.URL, "http://"))
	require.NoError(t, err)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get(relay.URL())
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	// The client keeps its connection open; Close does not wait for it.
	done := make(chan error, 1)
	go func() { done <- relay.Close() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited on an idle keep-alive connection")
	}
	_, err = net.DialTimeout("tcp", relay.Addr(), time.Second)
	require.Error(t, err, "nothing listens after Close")
}
