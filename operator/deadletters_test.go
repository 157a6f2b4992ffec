package operator_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/harness/gatewaytest"
)

func TestDeadLetterAdminAPI(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	hw := "AA:BB:CC:DD:EE:30"
	boot := gatewaytest.NewBoot()
	for i := range 2 {
		resp, _ := gatewaytest.PostJSON(t, h.HTTPURL+"/v1/readings", gatewaytest.GoodKey, gatewaytest.BatchJSON(hw, boot, i, 2))
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	pending, err := h.Buf.Pending(0, 10)
	require.NoError(t, err)
	require.Len(t, pending, 2)
	first := pending[0]
	require.NoError(t, h.Buf.DeadLetter(first, "ValidationException: item size has exceeded the maximum allowed size"))

	var list struct {
		Count       int                 `json:"count"`
		DeadLetters []buffer.DeadLetter `json:"dead_letters"`
	}
	require.Equal(t, http.StatusOK, gatewaytest.AdminDo(t, h, http.MethodGet, "/v1/dead-letters", gatewaytest.AdminToken, &list))
	require.Equal(t, 1, list.Count)
	require.Len(t, list.DeadLetters, 1)
	require.Equal(t, first.BatchID, list.DeadLetters[0].BatchID)
	require.Equal(t, hw, list.DeadLetters[0].HardwareID)
	require.Equal(t, "ValidationException: item size has exceeded the maximum allowed size", list.DeadLetters[0].Reason)

	var errBody struct {
		Status  string `json:"status"`
		Message string `json:"message"`
	}
	tests := []struct {
		name, method, path, token string
		code                      int
		message                   string
	}{
		{"no token", http.MethodGet, "/v1/dead-letters", "", http.StatusUnauthorized, "admin token"},
		{"wrong token", http.MethodPost, "/v1/dead-letters/" + first.BatchID + "/reforward", gatewaytest.GoodKey, http.StatusUnauthorized, "admin token"},
		{"bad limit", http.MethodGet, "/v1/dead-letters?limit=0", gatewaytest.AdminToken, http.StatusBadRequest, "limit: must be a whole number from 1 to 1000"},
		{"unknown batch", http.MethodPost, "/v1/dead-letters/nope/reforward", gatewaytest.AdminToken, http.StatusNotFound, "no batch nope"},
		{"pending batch", http.MethodPost, "/v1/dead-letters/" + pending[1].BatchID + "/reforward", gatewaytest.AdminToken, http.StatusConflict, "is pending"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.code, gatewaytest.AdminDo(t, h, tt.method, tt.path, tt.token, &errBody))
			require.Equal(t, "error", errBody.Status)
			require.Contains(t, errBody.Message, tt.message)
		})
	}

	var done struct {
		Status  string `json:"status"`
		BatchID string `json:"batch_id"`
		Seq     uint64 `json:"seq"`
	}
	require.Equal(t, http.StatusOK, gatewaytest.AdminDo(t, h, http.MethodPost, "/v1/dead-letters/"+first.BatchID+"/reforward", gatewaytest.AdminToken, &done))
	require.Equal(t, "reforwarded", done.Status)
	require.Equal(t, first.BatchID, done.BatchID)
	pending, err = h.Buf.Pending(0, 10)
	require.NoError(t, err)
	require.Len(t, pending, 2)
	require.Equal(t, first.BatchID, pending[1].BatchID, "queued again after the device's later batch")
	require.Equal(t, done.Seq, pending[1].Seq)

	require.Equal(t, http.StatusConflict, gatewaytest.AdminDo(t, h, http.MethodPost, "/v1/dead-letters/"+first.BatchID+"/reforward", gatewaytest.AdminToken, &errBody))
	require.Equal(t, http.StatusOK, gatewaytest.AdminDo(t, h, http.MethodGet, "/v1/dead-letters?limit=5", gatewaytest.AdminToken, &list))
	require.Zero(t, list.Count)
	require.NotNil(t, list.DeadLetters)
}
