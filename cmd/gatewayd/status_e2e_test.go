package main

import (
	"greenhouse-gateway/operator"
)

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

// TestStatusEndToEnd checks the status page and its JSON twin of a real
// gatewayd: a batch taken over HTTP and delivered to DynamoDB Local shows
// as an empty backlog of an uplink that is up, the device as seen and
// listed, and a conflicting resend of it as a recent reject.
func TestStatusEndToEnd(t *testing.T) {
	const token = "e2e-admin-token"
	local, view, key, prefix := setup(t)
	d := startDaemon(t, t.TempDir(), local.Endpoint, prefix, "GATEWAY_ADMIN_TOKEN="+token)
	base := "http://" + d.httpAddr

	hw := "02:00:00:00:AA:07"
	post := func(payload []byte) int {
		req, err := http.NewRequest(http.MethodPost, base+"/v1/readings", strings.NewReader(string(payload)))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	payload := batch(hw, uuid.NewString(), 0, 2)
	require.Equal(t, http.StatusOK, post(payload))
	require.Eventually(t, func() bool { return len(view.readings(t, hw)) == 2 }, 60*time.Second, 100*time.Millisecond)
	// The same batch_id with other content: refused, and kept in the audit trail.
	require.Equal(t, http.StatusConflict, post([]byte(strings.Replace(string(payload), "45.2", "45.9", 1))))

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
	var s operator.StatusData
	require.Eventually(t, func() bool {
		resp, body := get("/v1/status", true)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		s = operator.StatusData{}
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
	require.Len(t, s.Devices.Recent, 1)
	require.Equal(t, hw, s.Devices.Recent[0].HardwareID)
	require.EqualValues(t, 1, s.Devices.Recent[0].Boots)
	require.False(t, s.Devices.Recent[0].Registered, "sent readings without registering")
	require.NotNil(t, s.Rejects)
	require.Empty(t, s.Rejects.Error)
	require.Len(t, s.Rejects.Recent, 1)
	rej := s.Rejects.Recent[0]
	require.Equal(t, "conflict", rej.Reason)
	require.Equal(t, hw, rej.HardwareID)
	require.Equal(t, "http", rej.Transport)
	require.Equal(t, map[string]int{"conflict": 1}, s.Rejects.LastHour.ByReason)

	resp, body := get("/", true)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	page := string(body)
	for _, want := range []string{"<title>Greenhouse gateway</title>", `<span class="badge ok">up</span>`,
		"<dd>0 batches, 0 B</dd>", "<b>1</b>known", "No device needs attention.",
		`<section id="device-list" class="wide">`, `<td class="hw">` + hw + `</td>`, `<span class="badge warn">no</span>`,
		`<section id="rejects" class="wide">`, `<span class="badge warn">newest 1</span>`, `<span class="badge warn">conflict 1</span>`,
		`<td>http <span class="muted">readings</span></td><td class="hw">` + hw + `</td><td class="nowrap">conflict</td>`} {
		require.Contains(t, page, want)
	}
	resp, _ = get("/", false)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Equal(t, `Basic realm="greenhouse-gateway"`, resp.Header.Get("WWW-Authenticate"))
}
