package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/internal/config"
)

// settingName is the setting an error of Validate starts with.
var settingName = regexp.MustCompile(`^[a-z0-9_.]+`)

// FuzzLoadConfig layers an arbitrary YAML file and one environment
// variable over the defaults. It never panics; an error names the file (and
// yaml's line), the variable and its setting, or the invalid setting; and a
// configuration it accepts prints (--print-config) to a file that loads
// back to the same configuration.
func FuzzLoadConfig(f *testing.F) {
	def := defaultConfig()
	printed, err := config.Encode(def)
	require.NoError(f, err)
	vars := config.Vars(envPrefix, &def)
	f.Add(printed, uint8(0), "")
	for _, s := range []string{
		"", "data_dir: /srv/gw\nmqtt:\n  addr: \":1884\"\nuplink:\n  transaction_max_items: 10\n  max_backoff: 1m\nbuffer:\n  retention: 48h\n",
		"mqtt:\n  adr: x\n", "uplink:\n  concurrency: lots\n", "uplink:\n  transaction_max_items: 500\n", "log_level: loud\n",
		"mqtt:\n  mode: external\n  external:\n    url: tcp://broker:1883\n", "mqtt:\n  max_packet_size: 10\n",
		"http:\n  max_body_bytes: -1\n", "auth:\n  negative_ttl: -1s\n", "devices:\n  flush_interval: -5s\n",
		"ingest:\n  ordering: sideways\n", "mqtt:\n  tls_cert_file: a.pem\n", "shutdown_timeout: 0s\n",
	} {
		f.Add([]byte(s), uint8(0), "")
	}
	for i := range vars {
		f.Add([]byte(""), uint8(i), "-1")
		f.Add([]byte(""), uint8(i), "x")
	}
	for _, value := range []string{"0", "1h", "true", "\xff", "a\nb", "#c", " spaced "} {
		f.Add([]byte(""), uint8(0), value)
	}
	// Every setting's path, and the sections (uplink: durations must not
	// be negative, names only the section).
	names := map[string]bool{}
	for _, v := range vars {
		names[v.Path] = true
		for p := v.Path; strings.Contains(p, "."); {
			p = p[:strings.LastIndex(p, ".")]
			names[p] = true
		}
	}
	dir := f.TempDir()
	file := filepath.Join(dir, "gateway.yaml")
	again := filepath.Join(dir, "printed.yaml")
	f.Fuzz(func(t *testing.T, data []byte, envSel uint8, envValue string) {
		require.NoError(t, os.WriteFile(file, data, 0o600))
		envName := vars[int(envSel)%len(vars)].Name
		environ := []string{envPepper + "=p", envName + "=" + envValue}
		cfg, _, _, err := loadConfig([]string{"--config", file}, environ)
		if err != nil {
			msg := err.Error()
			switch {
			case strings.HasPrefix(msg, "config "+file+": yaml: "):
			case strings.HasPrefix(msg, "environment variable "+envName+" ("):
			case strings.HasPrefix(msg, "invalid configuration: "):
				setting := settingName.FindString(strings.TrimPrefix(msg, "invalid configuration: "))
				require.True(t, names[setting], "the error names no setting: %q", msg)
			default:
				t.Fatalf("unexpected error: %q", msg)
			}
			return
		}
		require.NoError(t, cfg.Validate())
		out, err := config.Encode(cfg)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(again, out, 0o600))
		reloaded, _, _, err := loadConfig([]string{"--config", again}, []string{envPepper + "=p"})
		require.NoError(t, err, "the printed configuration loads:\n%s", out)
		require.Equal(t, cfg, reloaded, "printed:\n%s", out)
	})
}
