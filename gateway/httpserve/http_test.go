package httpserve_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/gateway/httpserve"
	"greenhouse-gateway/harness/gatewaytest"
)

func multi(batches ...[]byte) []byte {
	return []byte(`{"batches":[` + string(bytes.Join(batches, []byte(","))) + `]}`)
}

func TestHTTPReadingsStatusCodes(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	url := h.HTTPURL + "/v1/readings"
	hw := "AA:BB:CC:DD:EE:10"
	boot := gatewaytest.NewBoot()
	a, b, c := gatewaytest.BatchJSON(hw, boot, 0, 2), gatewaytest.BatchJSON(hw, boot, 1, 2), gatewaytest.BatchJSON(hw, boot, 2, 2)
	invalid := []byte(`{"batch_id":"nope"}`)
	conflictA := []byte(strings.Replace(string(a), "45.2", "99.9", 1))

	tests := []struct {
		name     string
		key      string
		body     []byte
		code     int
		status   string
		statuses []contract.Status
		reasons  []contract.Reason
	}{
		{"one batch accepted", gatewaytest.GoodKey, a, 200, "ok", []contract.Status{"accepted"}, nil},
		{"replay is a duplicate", gatewaytest.GoodKey, a, 200, "ok", []contract.Status{"duplicate"}, nil},
		{"several batches", gatewaytest.GoodKey, multi(a, b), 200, "ok", []contract.Status{"duplicate", "accepted"}, nil},
		{"mixed", gatewaytest.GoodKey, multi(c, invalid), 207, "partial", []contract.Status{"accepted", "rejected"},
			[]contract.Reason{"", contract.ReasonValidation}},
		{"all invalid", gatewaytest.GoodKey, multi(invalid, invalid), 400, "error", []contract.Status{"rejected", "rejected"},
			[]contract.Reason{contract.ReasonValidation, contract.ReasonValidation}},
		{"single conflict", gatewaytest.GoodKey, conflictA, 409, "error", []contract.Status{"rejected"},
			[]contract.Reason{contract.ReasonConflict}},
		{"bad key", gatewaytest.OtherKey, a, 401, "error", nil, nil},
		{"no key", "", a, 401, "error", nil, nil},
		{"not JSON", gatewaytest.GoodKey, []byte("readings please"), 400, "error", nil, nil},
		{"over the body limit", gatewaytest.GoodKey, bytes.Repeat([]byte(" "), 65<<10), 413, "error", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, out := gatewaytest.PostJSON(t, url, tt.key, tt.body)
			require.Equal(t, tt.code, resp.StatusCode)
			require.Equal(t, tt.status, out.Status)
			require.Len(t, out.Results, len(tt.statuses))
			for i, st := range tt.statuses {
				require.Equal(t, st, out.Results[i].Status, "result %d", i)
				if tt.reasons != nil && tt.reasons[i] != "" {
					require.Equal(t, tt.reasons[i], *out.Results[i].Reason)
					require.NotEmpty(t, *out.Results[i].Message)
				}
			}
			require.Equal(t, len(tt.statuses), out.Summary.Received)
		})
	}
	require.EqualValues(t, 3, h.Buf.Stats().PendingBatches, "a, b and c, each once")
}

func TestHTTPFailedCommitIsNot2xx(t *testing.T) {
	h := gatewaytest.Start(t, gatewaytest.FailingStore{})
	resp, out := gatewaytest.PostJSON(t, h.HTTPURL+"/v1/readings", gatewaytest.GoodKey, gatewaytest.BatchJSON("AA:BB:CC:DD:EE:11", gatewaytest.NewBoot(), 0, 1))
	require.Equal(t, http.StatusInsufficientStorage, resp.StatusCode)
	require.NotEmpty(t, resp.Header.Get("Retry-After"))
	require.Equal(t, contract.ReasonBufferFull, *out.Results[0].Reason)
}

func TestHTTPXAPIKeyHeaderAndHealth(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	req, err := http.NewRequest(http.MethodPost, h.HTTPURL+"/v1/readings",
		bytes.NewReader(gatewaytest.BatchJSON("AA:BB:CC:DD:EE:12", gatewaytest.NewBoot(), 0, 1)))
	require.NoError(t, err)
	req.Header.Set("X-API-Key", gatewaytest.GoodKey)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := http.Get(h.HTTPURL + path)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		if path == "/metrics" {
			require.Contains(t, string(body), fmt.Sprintf(`gateway_ingest_batches_total{result="accepted",transport="http"} 1`))
		}
	}
}

func TestHTTPServerNeedsMetricsAndReady(t *testing.T) {
	_, err := httpserve.NewHTTPServer(httpserve.HTTPConfig{}, httpserve.HTTPDeps{Ready: func() error { return nil }}, nil)
	require.EqualError(t, err, "gateway: the HTTP API needs Metrics and Ready")
	_, err = httpserve.NewHTTPServer(httpserve.HTTPConfig{}, httpserve.HTTPDeps{Metrics: http.NotFoundHandler()}, nil)
	require.EqualError(t, err, "gateway: the HTTP API needs Metrics and Ready")

	// Without Ingest and Auth only the operator side is served.
	api, err := httpserve.NewHTTPServer(httpserve.HTTPConfig{}, httpserve.HTTPDeps{
		Metrics: http.NotFoundHandler(), Ready: func() error { return nil }}, nil)
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	httpserve.HTTPHandler(api).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/readings", strings.NewReader("{}")))
	require.Equal(t, http.StatusNotFound, rec.Code)
}
