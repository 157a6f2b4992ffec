package operator_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/gatewaytest"
	"greenhouse-gateway/internal/audit"
	"greenhouse-gateway/operator"
	"greenhouse-gateway/registry"
)

// FuzzAuditQuery sends arbitrary query strings to GET /v1/audit: the answer
// is 200 with at most the limit's records, or 400 naming what is wrong.
func FuzzAuditQuery(f *testing.F) {
	for _, q := range []string{"", "limit=5", "hardware_id=AA:BB:CC:DD:EE:01&reason=conflict", "since=1700000000000&until=2026-11-22T00:00:00Z",
		"since=2026-11-22T00:00:00.123456789%2B01:00", "limit=1001", "transport=mqtt&transport=http", "%zz", "since=99999999999999999999"} {
		f.Add(q)
	}
	log, err := audit.Open(f.TempDir(), audit.Config{}, nil, nil, nil)
	require.NoError(f, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- log.Run(ctx) }()
	f.Cleanup(func() { cancel(); <-done })
	for i := range 20 {
		log.Record(audit.Record{Transport: contract.TransportMQTT, HardwareID: "AA:BB:CC:DD:EE:01", Reason: audit.Reasons[i%len(audit.Reasons)]})
	}
	reg := prometheus.NewRegistry()
	buf, err := buffer.Open(f.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(f, err)
	f.Cleanup(func() { _ = buf.Close() })
	devices, err := registry.New(registry.Config{}, buf, nil, nil, reg)
	require.NoError(f, err)
	handler := http.NewServeMux()
	operator.New(operator.Deps{Devices: devices, AdminToken: gatewaytest.AdminToken, Audit: log}, nil).Routes(handler)
	f.Fuzz(func(t *testing.T, query string) {
		req := httptest.NewRequest(http.MethodGet, "/v1/audit", nil)
		req.URL.RawQuery = query
		req.Header.Set("Authorization", "Bearer "+gatewaytest.AdminToken)
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		var out struct {
			Count   int            `json:"count"`
			Records []audit.Record `json:"records"`
			Message string         `json:"message"`
		}
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out), rec.Body.String())
		switch rec.Code {
		case http.StatusOK:
			require.Equal(t, out.Count, len(out.Records))
			require.LessOrEqual(t, out.Count, 1000)
		case http.StatusBadRequest:
			require.Contains(t, out.Message, ":", "the message names the parameter")
		default:
			t.Fatalf("status %d: %s", rec.Code, rec.Body.String())
		}
	})
}
