package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/audit"
)

// auditRecords queries the daemon's GET /v1/audit.
func auditRecords(t *testing.T, d *daemon, token, query string) []audit.Record {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+d.httpAddr+"/v1/audit?"+query, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var out struct {
		Records []audit.Record `json:"records"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return out.Records
}

// TestAuditTrailSurvivesKillDashNine runs the real gatewayd: a duplicate,
// a conflict and a request with a wrong key are recorded under
// <data_dir>/audit, and once a query has seen them they survive SIGKILL
// and a restart (which starts a new segment).
func TestAuditTrailSurvivesKillDashNine(t *testing.T) {
	local, _, key, prefix := setup(t)
	dataDir := t.TempDir()
	const token = "e2e-admin-token"
	d := startDaemon(t, dataDir, local.Endpoint, prefix, "GATEWAY_ADMIN_TOKEN="+token)
	hw := "02:00:00:00:AA:20"
	dev := connect(t, d.mqttAddr, hw, key)
	payload := batch(hw, uuid.NewString(), 0, 2)
	require.Equal(t, contract.StatusAccepted, dev.send(t, payload).Status)
	require.Equal(t, contract.StatusDuplicate, dev.send(t, payload).Status)
	require.Equal(t, contract.ReasonConflict, *dev.send(t, []byte(strings.Replace(string(payload), "45.2", "45.9", 1))).Reason)
	req, err := http.NewRequest(http.MethodPost, "http://"+d.httpAddr+"/v1/readings", strings.NewReader(string(payload)))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer not-a-key")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	reasons := func(recs []audit.Record) []string {
		var out []string
		for _, r := range recs {
			out = append(out, r.Reason)
		}
		return out
	}
	want := []string{audit.ReasonUnauthorized, audit.ReasonConflict, audit.ReasonDuplicate}
	require.Equal(t, want, reasons(auditRecords(t, d, token, "")), "newest first")
	require.Equal(t, "1", d.metric(t, `gateway_audit_records_total{reason="conflict"}`))

	before, err := filepath.Glob(filepath.Join(dataDir, "audit", "*.ndjson"))
	require.NoError(t, err)
	require.NoError(t, d.cmd.Process.Kill()) // kill -9
	<-d.exited
	d.exited <- nil

	d = startDaemon(t, dataDir, local.Endpoint, prefix, "GATEWAY_ADMIN_TOKEN="+token)
	require.Equal(t, want, reasons(auditRecords(t, d, token, "")), "kept across kill -9")
	dev = connect(t, d.mqttAddr, hw, key)
	require.Equal(t, contract.StatusDuplicate, dev.send(t, payload).Status)
	recs := auditRecords(t, d, token, "hardware_id="+hw+"&reason=duplicate")
	require.Len(t, recs, 2)
	require.Equal(t, contract.TransportMQTT, recs[0].Transport)
	require.True(t, recs[0].Time.After(recs[1].Time))
	segments, err := filepath.Glob(filepath.Join(dataDir, "audit", "*.ndjson"))
	require.NoError(t, err)
	var started []string
	for _, s := range segments {
		if !slices.Contains(before, s) {
			started = append(started, s)
		}
	}
	require.Len(t, started, 1, "the restart began a new segment (of %v, before it %v)", segments, before)
	for _, s := range segments {
		raw, err := os.ReadFile(s)
		require.NoError(t, err)
		require.NotContains(t, string(raw), key, "no API key on disk")
	}
}
