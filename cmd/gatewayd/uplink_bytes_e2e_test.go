package main

import (
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/harness/byterelay"
)

// TestUplinkBytesAreCountedAtTheSocket sends batches through gatewayd to
// DynamoDB Local behind a byte-counting relay and, once the uplink is idle,
// compares: gateway_uplink_bytes_total, summed over its clients, is what the
// relay carried each way.
func TestUplinkBytesAreCountedAtTheSocket(t *testing.T) {
	if testing.Short() {
		t.Skip("runs gatewayd against DynamoDB Local")
	}
	local, view, key, prefix := setup(t)
	relay, err := byterelay.Start(strings.TrimPrefix(local.Endpoint, "http://"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = relay.Close() })
	d := startDaemon(t, filepath.Join(t.TempDir(), "data"), relay.URL(), prefix)
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
		return sent > 0 && relay.Up() == sent && relay.Down() == received
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
