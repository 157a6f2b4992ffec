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

	"greenhouse-gateway/gateway"
)

// TestStatusEndToEnd checks the status page and its JSON twin of a real
// gatewayd: a batch taken over HTTP and delivered to DynamoDB Local shows
// as an empty backlog of an uplink that is up, and the device as seen.
func TestStatusEndToEnd(t *testing.T) {
	const token = "e2e-admin-token"
	local, view, key, prefix := setup(t)
	d := startDaemon(t, t.TempDir(), local.Endpoint, prefix, "GATEWAY_ADMIN_TOKEN="+token)
	base := "http://" + d.httpAddr

	hw := "02:00:00:00:AA:07"
	req, err := http.NewRequest(http.MethodPost, base+"/v1/readings", strings.NewReader(string(batch(hw, uuid.NewString(), 0, 2))))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Eventually(t, func() bool { return len(view.readings(t, hw)) == 2 }, 60*time.Second, 100*time.Millisecond)

	get := func(path string, basic bool) (*http.Response, []byte) {
		req, err := http.NewRequest(http.MethodGet, base+path, nil)
		require.NoError(t, err)
		if basic {
			req.SetBasicAuth("operator", token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, body
	}
	// The readings are in DynamoDB before the batch leaves the backlog:
	// wait for the status that says so.
	var s gateway.StatusData
	require.Eventually(t, func() bool {
		resp, body := get("/v1/status", true)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		s = gateway.StatusData{}
		require.NoError(t, json.Unmarshal(body, &s))
		return s.Uplink != nil && s.Uplink.State == "up" && s.Uplink.BacklogBatches == 0
	}, 60*time.Second, 100*time.Millisecond)
	require.Equal(t, "dev", s.Version)
	require.True(t, s.Ready)
	require.Positive(t, s.UptimeSeconds)
	require.Zero(t, s.Uplink.BacklogBytes)
	require.NotNil(t, s.Buffer)
	require.EqualValues(t, 1<<30, s.Buffer.BudgetBytes, "the default budget")
	require.Positive(t, s.Buffer.UsedBytes)
	require.NotNil(t, s.Buffer.FreeBytes)
	require.Positive(t, *s.Buffer.FreeBytes)
	require.NotNil(t, s.Clock)
	require.True(t, s.Clock.Plausible)
	require.Equal(t, 1, s.Devices.Known)
	require.Equal(t, 1, s.Devices.SeenLastHour)
	require.Zero(t, s.Devices.NeedAttention)

	resp, body := get("/", true)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	page := string(body)
	for _, want := range []string{"<title>Greenhouse gateway</title>", `<span class="badge ok">up</span>`,
		"<dd>0 batches, 0 B</dd>", "<b>1</b>known", "No device needs attention."} {
		require.Contains(t, page, want)
	}
	resp, _ = get("/", false)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Equal(t, `Basic realm="greenhouse-gateway"`, resp.Header.Get("WWW-Authenticate"))
}
