package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHTTPConnectionLimitsFromFileAndEnvironment(t *testing.T) {
	file := writeFile(t, "http:\n  max_conns: 300\n  read_header_timeout: 5s\n  idle_timeout: 30s\n")
	cfg, _, unknown, err := loadConfig([]string{"--config", file},
		[]string{"GATEWAY_API_KEY_PEPPER=x", "GATEWAY_HTTP_MAX_CONNS_PER_ADDR=16", "GATEWAY_HTTP_WRITE_TIMEOUT=1m"})
	require.NoError(t, err)
	require.Empty(t, unknown)
	require.Equal(t, 300, cfg.HTTP.MaxConns)
	require.Equal(t, 16, cfg.HTTP.MaxConnsPerAddr)
	require.Equal(t, 5*time.Second, cfg.HTTP.ReadHeaderTimeout)
	require.Equal(t, 30*time.Second, cfg.HTTP.ReadTimeout, "default")
	require.Equal(t, time.Minute, cfg.HTTP.WriteTimeout)
	require.Equal(t, 30*time.Second, cfg.HTTP.IdleTimeout)

	def := defaultConfig().HTTP
	require.Equal(t, 1024, def.MaxConns)
	require.Equal(t, 64, def.MaxConnsPerAddr)

	for env, want := range map[string]string{
		"GATEWAY_HTTP_MAX_CONNS=-1":           "http.max_conns: must not be negative",
		"GATEWAY_HTTP_READ_TIMEOUT=-1s":       "http.read_timeout: must not be negative",
		"GATEWAY_HTTP_MAX_CONNS_PER_ADDR=few": "GATEWAY_HTTP_MAX_CONNS_PER_ADDR (http.max_conns_per_addr)",
	} {
		_, _, _, err := loadConfig(nil, []string{"GATEWAY_API_KEY_PEPPER=x", env})
		require.ErrorContains(t, err, want, env)
	}
}
