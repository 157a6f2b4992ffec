package operator_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/harness/gatewaytest"
)

func TestAdminAPINeedsTheToken(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	for _, key := range []string{"", gatewaytest.GoodKey, "admin-secreT"} {
		req, err := http.NewRequest(http.MethodGet, h.HTTPURL+"/v1/devices", nil)
		require.NoError(t, err)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "key %q", key)
	}
	require.Equal(t, http.StatusNotFound, gatewaytest.AdminGet(t, h, "/v1/devices/AA:BB:CC:DD:EE:99", nil))
	require.Equal(t, http.StatusBadRequest, gatewaytest.AdminGet(t, h, "/v1/devices/aa:bb", nil))
}

func TestStateChangingOperatorRequestsRefuseCrossSiteAndBasic(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	url := h.HTTPURL + "/v1/dead-letters/nope/reforward"
	host := strings.TrimPrefix(h.HTTPURL, "http://")
	bearer := func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+gatewaytest.AdminToken) }
	basic := func(r *http.Request) { r.SetBasicAuth("operator", gatewaytest.AdminToken) }
	tests := []struct {
		name    string
		creds   func(*http.Request)
		headers map[string]string
		code    int
		message string
	}{
		{"cross-site form post with cached Basic", basic,
			map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "http://evil.example",
				"Content-Type": "application/x-www-form-urlencoded"}, 403, "cross-site request refused"},
		{"cross-site with Bearer", bearer, map[string]string{"Sec-Fetch-Site": "cross-site"}, 403, "cross-site request refused"},
		{"same-site but another origin", bearer, map[string]string{"Sec-Fetch-Site": "same-site"}, 403, "cross-site request refused"},
		{"old browser, another Origin", bearer, map[string]string{"Origin": "http://evil.example"}, 403, "Origin does not match Host"},
		{"same-origin with Basic", basic, map[string]string{"Sec-Fetch-Site": "same-origin"}, 403, "Basic credentials refused"},
		{"Basic without browser headers", basic, nil, 403, "Authorization: Bearer TOKEN"},
		{"same-origin with Bearer", bearer, map[string]string{"Sec-Fetch-Site": "same-origin"}, 404, "no batch nope"},
		{"old browser, own Origin, Bearer", bearer, map[string]string{"Origin": "http://" + host}, 404, "no batch nope"},
		{"non-browser client with Bearer", bearer, nil, 404, "no batch nope"},
		{"X-API-Key", func(r *http.Request) { r.Header.Set("X-API-Key", gatewaytest.AdminToken) }, nil, 404, "no batch nope"},
		{"wrong Bearer", func(r *http.Request) { r.Header.Set("Authorization", "Bearer nope") }, nil, 401, "admin token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, url, strings.NewReader("x=1"))
			require.NoError(t, err)
			tt.creds(req)
			for k, v := range tt.headers {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			var body struct{ Status, Message string }
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
			require.Equal(t, tt.code, resp.StatusCode, body.Message)
			require.Contains(t, body.Message, tt.message)
			require.Equal(t, "no-store", resp.Header.Get("Cache-Control"))
			require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))
		})
	}

	t.Run("reads with Basic stay open to the browser", func(t *testing.T) {
		req, err := http.NewRequest(http.MethodGet, h.HTTPURL+"/v1/status", nil)
		require.NoError(t, err)
		basic(req)
		req.Header.Set("Sec-Fetch-Site", "none")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	})
}
