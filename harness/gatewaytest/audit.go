package gatewaytest

import (
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/internal/audit"
)

// AuditAnswer is the body of a GET /v1/audit answer.
type AuditAnswer struct {
	Count        int            `json:"count"`
	Records      []audit.Record `json:"records"`
	More         bool           `json:"more"`
	NextUntil    string         `json:"next_until"`
	SkippedLines int            `json:"skipped_lines"`
	Message      string         `json:"message"`
}

// GetAudit calls GET /v1/audit with the admin token (token "" sends none).
func GetAudit(t *testing.T, h *Gateway, token, query string) (int, AuditAnswer) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, h.HTTPURL+"/v1/audit?"+query, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out AuditAnswer
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out
}

// AuditOf returns the records of one device and reason. A query first
// writes every record queued before it, so a refusal the client has seen
// the answer to is there.
func AuditOf(t *testing.T, h *Gateway, hw, reason string) []audit.Record {
	t.Helper()
	q := url.Values{"reason": {reason}}
	if hw != "" {
		q.Set("hardware_id", hw)
	}
	code, out := GetAudit(t, h, AdminToken, q.Encode())
	require.Equal(t, http.StatusOK, code, out.Message)
	return out.Records
}

// RequireNoKeysOnDisk checks that no API key reached the audit trail.
func RequireNoKeysOnDisk(t *testing.T, h *Gateway) {
	t.Helper()
	entries, err := os.ReadDir(h.AuditDir)
	require.NoError(t, err)
	require.NotEmpty(t, entries)
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join(h.AuditDir, e.Name()))
		require.NoError(t, err)
		require.NotContains(t, string(raw), GoodKey)
		require.NotContains(t, string(raw), OtherKey)
	}
}
