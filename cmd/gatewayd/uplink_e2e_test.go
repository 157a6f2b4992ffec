package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

func TestUplinkReportOverTheOperatorAPI(t *testing.T) {
	local, view, key, prefix := setup(t)
	const token = "uplink-report-token"
	d := startDaemon(t, t.TempDir(), local.Endpoint, prefix, "GATEWAY_ADMIN_TOKEN="+token)
	hw := "02:00:00:00:AA:10"
	boot := uuid.NewString()
	body := `{"batches":[` + string(batch(hw, boot, 0, 2)) + `,` + string(batch(hw, boot, 1, 3)) + `]}`
	req, err := http.NewRequest(http.MethodPost, "http://"+d.httpAddr+"/v1/readings", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Eventually(t, func() bool { return d.metric(t, "gateway_buffer_pending_batches") == "0" }, 60*time.Second, 100*time.Millisecond)
	require.Len(t, view.readings(t, hw), 5)

	get := func(auth string) (int, map[string]any) {
		req, err := http.NewRequest(http.MethodGet, "http://"+d.httpAddr+"/v1/uplink", nil)
		require.NoError(t, err)
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		var out map[string]any
		require.NoError(t, json.Unmarshal(raw, &out), string(raw))
		return resp.StatusCode, out
	}
	for _, auth := range []string{"", key, "wrong"} {
		code, _ := get(auth)
		require.Equal(t, http.StatusUnauthorized, code, "token %q", auth)
	}
	code, r := get(token)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "up", r["state"])
	require.EqualValues(t, 0, r["backlog_batches"])
	require.EqualValues(t, 0, r["eta_seconds"], "no backlog: nothing to drain")
	require.NotEmpty(t, r["last_delivery_at"])
	require.Positive(t, r["drain_rate_batches_per_second"])
	require.EqualValues(t, 16, r["concurrency"], "uplink.concurrency at start, successes grow it slowly")
	require.Equal(t, "0", d.metric(t, "gateway_uplink_drain_eta_seconds"))
}
