package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// resetKeyServer is a gateway's reset-key route: it records the requests
// it gets and answers code with body.
type resetKeyServer struct {
	mu       sync.Mutex
	requests []string // "METHOD PATH AUTHORIZATION"
	code     int
	body     any
}

func (s *resetKeyServer) start(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.requests = append(s.requests, r.Method+" "+r.URL.EscapedPath()+" "+r.Header.Get("Authorization"))
		code, body := s.code, s.body
		s.mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer "+testAdminToken {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func (s *resetKeyServer) taken() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.requests
	s.requests = nil
	return out
}

func TestDevicesResetKey(t *testing.T) {
	const hw = "AA:BB:CC:DD:EE:01"
	const keyID = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
	s := &resetKeyServer{code: http.StatusOK,
		body: map[string]any{"hardware_id": hw, "status": "reset", "revoked_key_id": keyID}}
	base := s.start(t)
	env := map[string]string{envAdminToken: testAdminToken}
	wantRequest := "POST /v1/devices/" + hw + "/reset-key Bearer " + testAdminToken

	r := ctl(t, env, "devices", "reset-key", "--url", base, hw)
	require.Equal(t, exitOK, r.code)
	require.Equal(t, []string{wantRequest}, s.taken())
	require.Contains(t, r.stdout, "revoked device key "+keyID+" of "+hw)
	require.Contains(t, r.stdout, "next registration with a fleet key enrolls it again")
	require.Empty(t, r.stderr)

	// A device without a key: nothing was revoked, and the output says so.
	s.body = map[string]any{"hardware_id": hw, "status": "reset", "revoked_key_id": nil}
	r = ctl(t, env, "devices", "reset-key", hw, "--url", base)
	require.Equal(t, exitOK, r.code)
	require.Equal(t, []string{wantRequest}, s.taken())
	require.Contains(t, r.stdout, hw+" had no device key; nothing revoked")
	require.NotContains(t, r.stdout, "revoked device key")

	// The gateway's refusal is shown with its message.
	s.code, s.body = http.StatusBadRequest, map[string]any{"message": "hardware_id: must be upper case"}
	r = ctl(t, env, "devices", "reset-key", "--url", base, hw)
	require.Equal(t, exitError, r.code)
	require.Contains(t, r.stderr, "gatewayctl devices reset-key: 400: hardware_id: must be upper case")
	require.Empty(t, r.stdout)
	s.taken()

	// A gateway without the route.
	s.code, s.body = http.StatusNotFound, map[string]any{}
	r = ctl(t, env, "devices", "reset-key", "--url", base, hw)
	require.Equal(t, exitError, r.code)
	require.Contains(t, r.stderr, "has no reset-key route")
	s.taken()

	// Wrong usage is refused before any request.
	for _, tt := range []struct {
		name string
		env  map[string]string
		args []string
		code int
		want string
	}{
		{"lower case", env, []string{"devices", "reset-key", "--url", base, "aa:bb:cc:dd:ee:01"}, exitUsage, "HW: must be upper case"},
		{"not a MAC", env, []string{"devices", "reset-key", "--url", base, "sensor-1"}, exitUsage, "HW: must be a MAC address in upper case"},
		{"no hardware_id", env, []string{"devices", "reset-key", "--url", base}, exitUsage, "want [--url URL] [--admin-token-file FILE] HW, got 0 arguments"},
		{"no token", nil, []string{"devices", "reset-key", "--url", base, hw}, exitError, "needs the admin token"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := ctl(t, tt.env, tt.args...)
			require.Equal(t, tt.code, r.code)
			require.Contains(t, r.stderr, tt.want)
			require.Empty(t, s.taken())
		})
	}

	// A wrong token is the gateway's refusal.
	r = ctl(t, map[string]string{envAdminToken: "nope"}, "devices", "reset-key", "--url", base, hw)
	require.Equal(t, exitError, r.code)
	require.Contains(t, r.stderr, "admin token rejected")
	require.Equal(t, []string{"POST /v1/devices/" + hw + "/reset-key Bearer nope"}, s.taken())
}
