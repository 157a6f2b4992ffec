package main

import (
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// byteRelay is a TCP relay that counts the bytes crossing it each way: an
// independent count of what gatewayd puts on its uplink.
type byteRelay struct {
	ln       net.Listener
	up, down atomic.Int64 // from the gateway, to the gateway
}

func startByteRelay(t *testing.T, target string) *byteRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r := &byteRelay{ln: ln}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			wg.Add(2)
			pipe := func(dst, src net.Conn, n *atomic.Int64) {
				defer wg.Done()
				_, _ = io.Copy(countingWriter{dst, n}, src)
				_ = dst.Close()
				_ = src.Close()
			}
			go pipe(out, in, &r.up)
			go pipe(in, out, &r.down)
		}
	}()
	return r
}

// countingWriter counts what it writes, as it writes it.
type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// TestUplinkBytesAreCountedAtTheSocket sends batches through gatewayd to
// DynamoDB Local behind a byte-counting relay and, once the uplink is idle,
// compares: gateway_uplink_bytes_total, summed over its clients, is what the
// relay carried each way.
func TestUplinkBytesAreCountedAtTheSocket(t *testing.T) {
	if testing.Short() {
		t.Skip("runs gatewayd against DynamoDB Local")
	}
	local, view, key, prefix := setup(t)
	relay := startByteRelay(t, strings.TrimPrefix(local.Endpoint, "http://"))
	d := startDaemon(t, filepath.Join(t.TempDir(), "data"), "http://"+relay.ln.Addr().String(), prefix)
	hw := "02:00:00:00:D1:B0"
	boot := uuid.NewString()
	var batches [][]byte
	for i := range 20 {
		batches = append(batches, denseBatch(hw, boot, i))
	}
	code, _, _, err := tryPost(d, key, batches)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	require.Eventually(t, func() bool { return d.metric(t, "gateway_buffer_pending_batches") == "0" },
		60*time.Second, 100*time.Millisecond)
	require.Len(t, view.markers(t), 20)

	// Once the uplink is idle (an idle uplink sends nothing), both counts
	// stand still, and agree.
	var sent, received int64
	require.Eventually(t, func() bool {
		sent, received = uplinkBytes(t, d, "sent"), uplinkBytes(t, d, "received")
		return sent > 0 && relay.up.Load() == sent && relay.down.Load() == received
	}, 30*time.Second, 200*time.Millisecond, "the relay's counts and gatewayd's agree once the uplink is idle")
	for _, client := range []string{"dynamodb", "keys"} {
		v := d.metric(t, `gateway_uplink_bytes_total{client="`+client+`",direction="sent"}`)
		require.NotEmpty(t, v, client)
		require.NotEqual(t, "0", v, "%s sent something", client)
	}
	t.Logf("20 batches of 4 readings: %d bytes up, %d down (%d up per reading, headers included)", sent, received, sent/80)
}

// uplinkBytes sums gateway_uplink_bytes_total over its clients for one
// direction.
func uplinkBytes(t *testing.T, d *daemon, direction string) int64 {
	t.Helper()
	var total int64
	for _, client := range []string{"dynamodb", "keys", "lambda"} {
		v := d.metric(t, `gateway_uplink_bytes_total{client="`+client+`",direction="`+direction+`"}`)
		if v == "" {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		require.NoError(t, err)
		total += int64(f)
	}
	return total
}
