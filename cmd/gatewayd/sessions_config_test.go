package main

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSessionSettingsFromFileAndEnvironment(t *testing.T) {
	file := writeFile(t, `
mqtt:
  session_expiry: 10m
  max_queued_per_client: 20
  max_offline_sessions: 50
`)
	env := []string{"GATEWAY_MQTT_MAX_OFFLINE_SESSIONS_PER_DEVICE=2", "GATEWAY_MQTT_SESSION_MEMORY=8388608",
		"GATEWAY_MQTT_SESSION_EXPIRY=15m", "GATEWAY_API_KEY_PEPPER=x"}
	cfg, _, unknown, err := loadConfig([]string{"--config", file}, env)
	require.NoError(t, err)
	require.Empty(t, unknown)
	m := cfg.MQTT
	require.Equal(t, 15*time.Minute, m.SessionExpiry, "environment beats file")
	require.Equal(t, 20, m.MaxQueuedPerClient)
	require.Equal(t, 50, m.MaxOfflineSessions)
	require.Equal(t, 2, m.MaxOfflineSessionsPerDevice)
	require.Equal(t, int64(8<<20), m.SessionMemory)

	def, _, _, err := loadConfig(nil, []string{"GATEWAY_API_KEY_PEPPER=x"})
	require.NoError(t, err)
	require.Equal(t, time.Hour, def.MQTT.SessionExpiry)
	require.Equal(t, 100, def.MQTT.MaxQueuedPerClient)
	require.Equal(t, 1000, def.MQTT.MaxOfflineSessions)
	require.Equal(t, 4, def.MQTT.MaxOfflineSessionsPerDevice)
	require.Zero(t, def.MQTT.SessionMemory, "derived from the memory limit at start")

	_, _, _, err = loadConfig(nil, []string{"GATEWAY_MQTT_SESSION_EXPIRY=500ms", "GATEWAY_API_KEY_PEPPER=x"})
	require.ErrorContains(t, err, "mqtt.session_expiry: 500ms is not a whole number of seconds, at least 1s")
}

func TestSessionMemoryIsAShareOfTheMemoryLimit(t *testing.T) {
	require.Equal(t, int64(12<<20), sessionMemory(0, defaultMemoryLimit), "a sixteenth of the default 192 MiB")
	require.Equal(t, int64(5<<20), sessionMemory(5<<20, defaultMemoryLimit), "a setting wins")
	require.Equal(t, int64(1<<20), sessionMemory(0, 2<<20), "at least 1 MiB")
	require.Zero(t, sessionMemory(0, math.MaxInt64), "no memory limit: the broker's own default")
	require.Zero(t, sessionMemory(0, 0))
}
