package main

import (
	"greenhouse-gateway/operator"
)

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

const e2eAdminToken = "e2e-admin-token"

func adminQuery(t *testing.T, d *daemon, path string, out any) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+d.httpAddr+path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+e2eAdminToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.NoError(t, json.NewDecoder(resp.Body).Decode(out))
	return resp.StatusCode
}

// TestReadingsStayQueryableAfterDelivery posts batches over HTTP, waits
// until the uplink delivered them, and reads them back from the gateway,
// before and after a restart.
func TestReadingsStayQueryableAfterDelivery(t *testing.T) {
	local, view, key, prefix := setup(t)
	dataDir := t.TempDir()
	d := startDaemon(t, dataDir, local.Endpoint, prefix, "GATEWAY_ADMIN_TOKEN="+e2eAdminToken)
	hw := "02:00:00:00:AA:07"
	boot := uuid.NewString()
	body := `{"batches":[` + string(batch(hw, boot, 0, 3)) + `,` + string(batch(hw, boot, 1, 3)) + `]}`
	req, err := http.NewRequest(http.MethodPost, "http://"+d.httpAddr+"/v1/readings", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	require.Eventually(t, func() bool { return len(view.readings(t, hw)) == 6 }, 60*time.Second, 100*time.Millisecond)
	require.Eventually(t, func() bool { return d.metric(t, "gateway_buffer_history_batches") == "2" },
		30*time.Second, 50*time.Millisecond, "both batches are marked delivered and kept")

	q := url.Values{"from": {time.Now().Add(-3 * time.Hour).UTC().Format(time.RFC3339)}}
	check := func(d *daemon) {
		var page operator.ReadingsPage
		require.Equal(t, http.StatusOK, adminQuery(t, d, "/v1/devices/"+hw+"/readings?"+q.Encode(), &page))
		require.Equal(t, 12, page.Count, "3 readings of 2 sensors in each of 2 batches")
		for i, r := range page.Readings {
			require.Equal(t, "delivered", r.State)
			if i > 0 {
				require.GreaterOrEqual(t, r.TimestampMS, page.Readings[i-1].TimestampMS, "oldest first")
			}
		}
		var s operator.Summary
		sq := url.Values{"from": q["from"], "granularity": {"hour"}, "tz": {"America/New_York"}, "include_empty": {"false"}}
		require.Equal(t, http.StatusOK, adminQuery(t, d, "/v1/devices/"+hw+"/summary?"+sq.Encode(), &s))
		require.EqualValues(t, 6, s.Totals["humidity_pct"].Count)
		require.InDelta(t, 45.2, s.Totals["humidity_pct"].Mean, 1e-9)
		require.Equal(t, 20.0, s.Totals["bme280_temp_c"].Min)
		require.Equal(t, 20.2, s.Totals["bme280_temp_c"].Max)
	}
	check(d)

	require.NoError(t, d.stop(t, syscall.SIGTERM))
	d = startDaemon(t, dataDir, local.Endpoint, prefix, "GATEWAY_ADMIN_TOKEN="+e2eAdminToken)
	check(d)
}
