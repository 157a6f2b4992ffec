package gatewaytest

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// GatherValue returns the value of the series of name whose label is value
// (label "": the only series), 0 when there is none.
func GatherValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				match = match || (l.GetName() == label && l.GetValue() == value)
			}
			if !match {
				continue
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// BatchIDOf returns the batch_id member of a batch payload.
func BatchIDOf(t *testing.T, payload []byte) string {
	t.Helper()
	var b struct {
		BatchID string `json:"batch_id"`
	}
	require.NoError(t, json.Unmarshal(payload, &b))
	return b.BatchID
}

// WaitFor polls cond every 20 ms until it holds, failing t after timeout.
func WaitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ClosedWithin waits (at most within, from now) for the server to close
// each connection and returns how many it closed before early (a time);
// it fails if any is still open.
func ClosedWithin(t *testing.T, conns []net.Conn, early time.Time, within time.Duration) (closedEarly int) {
	t.Helper()
	start := time.Now()
	closed := 0
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(start.Add(within))
			_, err := io.Copy(io.Discard, c)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			closed++
			if time.Now().Before(early) {
				closedEarly++
			}
		}()
	}
	wg.Wait()
	require.Equal(t, len(conns), closed, "connections the server still holds after %s", within)
	return closedEarly
}
