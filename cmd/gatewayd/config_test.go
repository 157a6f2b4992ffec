package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/internal/config"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "gateway.yaml")
	require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
	return p
}

func TestConfigLayers(t *testing.T) {
	file := writeFile(t, `
data_dir: /srv/gw
mqtt:
  addr: ":1884"
http:
  addr: ":9090"
uplink:
  transaction_max_items: 10
  max_backoff: 1m
buffer:
  retention: 48h
`)
	env := []string{"GATEWAY_HTTP_ADDR=:9191", "GATEWAY_UPLINK_CONCURRENCY=4", "GATEWAY_API_KEY_PEPPER=x", "OTHER=1"}
	cfg, _, unknown, err := loadConfig([]string{"--config", file, "--mqtt-addr", "127.0.0.1:1999"}, env)
	require.NoError(t, err)
	require.Empty(t, unknown)
	require.Equal(t, "/srv/gw", cfg.DataDir, "file")
	require.Equal(t, "127.0.0.1:1999", cfg.MQTT.Addr, "flag beats file")
	require.Equal(t, ":9191", cfg.HTTP.Addr, "environment beats file")
	require.Equal(t, 4, cfg.Uplink.Concurrency)
	require.Equal(t, 10, cfg.Uplink.TransactionMaxItems)
	require.Equal(t, time.Minute, cfg.Uplink.MaxBackoff)
	require.Equal(t, 48*time.Hour, cfg.Buffer.Retention)
	require.Equal(t, 1024, cfg.Uplink.LeaseBatches, "defaults stay where nothing is set")
}

func TestConfigErrorsNameTheSetting(t *testing.T) {
	tests := []struct {
		name string
		file string
		env  []string
		args []string
		want string
	}{
		{"unknown key", "mqtt:\n  adr: x\n", nil, nil, "field adr not found"},
		{"wrong type", "uplink:\n  concurrency: lots\n", nil, nil, "line 2: cannot unmarshal"},
		{"bad env duration", "", []string{"GATEWAY_BUFFER_RETENTION=week"}, nil, "GATEWAY_BUFFER_RETENTION (buffer.retention)"},
		{"invalid value", "uplink:\n  transaction_max_items: 500\n", nil, nil, "uplink.transaction_max_items"},
		{"bad log level", "log_level: loud\n", nil, nil, "log_level"},
		{"bad endpoint", "dynamodb_endpoint: localhost:8000\n", nil, nil, `dynamodb_endpoint "localhost:8000": want an absolute http or https URL`},
		{"bad region", "", []string{"GATEWAY_AWS_REGION=eu west"}, nil, `aws_region "eu west"`},
		{"stray argument", "", nil, []string{"serve"}, "unexpected argument"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"--config", writeFile(t, tt.file)}, tt.args...)
			_, _, _, err := loadConfig(args, tt.env)
			require.ErrorContains(t, err, tt.want)
		})
	}
}

func TestConfigReportsUnknownEnvironment(t *testing.T) {
	_, _, unknown, err := loadConfig(nil, []string{"GATEWAY_MQTT_ADRR=:1", "GATEWAY_API_KEY_PEPPER=p"})
	require.NoError(t, err)
	require.Equal(t, []string{"GATEWAY_MQTT_ADRR"}, unknown)
}

// TestConfigurationDocumentsEverySetting keeps the configuration reference,
// docs/configuration.md, in step with the settings gatewayd has: each one
// has a row giving its YAML path and its environment variable.
func TestConfigurationDocumentsEverySetting(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	require.NoError(t, err)
	cfg := defaultConfig()
	for _, v := range config.Vars(envPrefix, &cfg) {
		row := "| `" + v.Path + "` | `" + v.Name + "` |"
		require.True(t, strings.Contains(string(doc), row), "docs/configuration.md's table lacks the row %s", row)
	}
}
