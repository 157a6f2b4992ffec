package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/harness/devicesim"
)

func noEnv(string) string { return "" }

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		check   func(t *testing.T, cfg devicesim.Config)
		wantErr string
	}{
		{
			name: "defaults are MQTT on localhost",
			args: []string{"--api-key", "k"},
			check: func(t *testing.T, cfg devicesim.Config) {
				require.Equal(t, "tcp://127.0.0.1:1883", cfg.MQTTURL)
				require.Empty(t, cfg.HTTPURL)
				require.Equal(t, 3, cfg.Devices)
				require.Equal(t, "02:00:00:00:00:01", cfg.FirstMAC)
				require.Equal(t, 5*time.Second, cfg.Interval)
				require.Equal(t, 5, cfg.Readings)
				require.Equal(t, 1, cfg.QoS)
				require.Equal(t, 1, cfg.MaxInflight)
				require.Equal(t, "1.0.16", cfg.FirmwareVersion)
				require.Zero(t, cfg.Batches)
				require.Zero(t, cfg.Duration)
				require.Zero(t, cfg.RebootEvery, "no reboots by default")
				require.Zero(t, cfg.Reboots)
			},
		},
		{
			name: "reboots",
			args: []string{"--api-key", "k", "--reboot-every", "90s", "--reboots", "4", "--clock-sync-after", "20s"},
			check: func(t *testing.T, cfg devicesim.Config) {
				require.Equal(t, 90*time.Second, cfg.RebootEvery)
				require.Equal(t, 4, cfg.Reboots)
				require.Equal(t, 20*time.Second, cfg.ClockSyncAfter)
			},
		},
		{
			name: "http instead of mqtt",
			args: []string{"--http-url", "http://127.0.0.1:8080", "--api-key", "k", "--devices", "7",
				"--first-mac", "aa:00:00:00:00:01", "--interval", "250ms", "--readings", "10", "--batches", "4",
				"--duration", "1m", "--qos", "0", "--seed", "9", "--report", "r.jsonl", "--max-inflight", "2",
				"--firmware-version", "2.0.0"},
			check: func(t *testing.T, cfg devicesim.Config) {
				require.Empty(t, cfg.MQTTURL)
				require.Equal(t, "http://127.0.0.1:8080", cfg.HTTPURL)
				require.Equal(t, 7, cfg.Devices)
				require.Equal(t, "aa:00:00:00:00:01", cfg.FirstMAC)
				require.Equal(t, 250*time.Millisecond, cfg.Interval)
				require.Equal(t, 10, cfg.Readings)
				require.Equal(t, 4, cfg.Batches)
				require.Equal(t, time.Minute, cfg.Duration)
				require.Equal(t, 0, cfg.QoS)
				require.Equal(t, uint64(9), cfg.Seed)
				require.Equal(t, "r.jsonl", cfg.ReportPath)
				require.Equal(t, 2, cfg.MaxInflight)
				require.Equal(t, "2.0.0", cfg.FirmwareVersion)
				require.Empty(t, cfg.KeyStorePath, "device keys in memory by default")
			},
		},
		{
			name: "key store",
			args: []string{"--api-key", "k", "--key-store", "keys.json"},
			check: func(t *testing.T, cfg devicesim.Config) {
				require.Equal(t, "keys.json", cfg.KeyStorePath)
			},
		},
		{
			name: "api key from the environment",
			args: nil,
			env:  map[string]string{"DEVICESIM_API_KEY": "from-env"},
			check: func(t *testing.T, cfg devicesim.Config) {
				require.Equal(t, "from-env", cfg.APIKey)
			},
		},
		{
			name: "flag wins over the environment",
			args: []string{"--api-key", "flag"},
			env:  map[string]string{"DEVICESIM_API_KEY": "from-env"},
			check: func(t *testing.T, cfg devicesim.Config) {
				require.Equal(t, "flag", cfg.APIKey)
			},
		},
		{name: "no key", args: nil, wantErr: "api key"},
		{name: "both transports", args: []string{"--api-key", "k", "--mqtt-url", "tcp://a:1883", "--http-url", "http://a"}, wantErr: "only one"},
		{name: "qos 2", args: []string{"--api-key", "k", "--qos", "2"}, wantErr: "qos"},
		{name: "reboots without interval", args: []string{"--api-key", "k", "--reboots", "2"}, wantErr: "reboot interval"},
		{name: "negative reboot interval", args: []string{"--api-key", "k", "--reboot-every", "-1s"}, wantErr: "reboot interval"},
		{name: "unknown flag", args: []string{"--api-key", "k", "--nope"}, wantErr: "not defined"},
		{name: "stray argument", args: []string{"--api-key", "k", "extra"}, wantErr: "unexpected arguments"},
		{name: "bad log level", args: []string{"--api-key", "k", "--log-level", "loud"}, wantErr: "log-level"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			getenv := func(k string) string { return tt.env[k] }
			cfg, _, err := parseFlags(tt.args, getenv, &bytes.Buffer{})
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			tt.check(t, cfg)
		})
	}
}

func TestRunExitCodes(t *testing.T) {
	var stderr bytes.Buffer
	require.Equal(t, 2, run([]string{"--devices", "0", "--api-key", "k"}, noEnv, &stderr), "bad flags")
	require.Contains(t, stderr.String(), "devices")
	var help bytes.Buffer
	require.Equal(t, 0, run([]string{"-h"}, noEnv, &help), "help")
	for _, f := range []string{"-reboot-every", "-reboots", "-clock-sync-after", "-qos", "-key-store"} {
		require.Contains(t, help.String(), f)
	}

	missing := filepath.Join(t.TempDir(), "no", "such", "dir", "report.jsonl")
	require.Equal(t, 1, run([]string{"--http-url", "http://127.0.0.1:1", "--api-key", "k", "--report", missing},
		noEnv, &bytes.Buffer{}), "setup error: the report cannot be created")

	badStore := filepath.Join(t.TempDir(), "keys.json")
	require.NoError(t, os.WriteFile(badStore, []byte(`{"02:00:00:00:00:01":"short"}`), 0o600))
	stderr.Reset()
	require.Equal(t, 1, run([]string{"--http-url", "http://127.0.0.1:1", "--api-key", "k", "--key-store", badStore},
		noEnv, &stderr), "setup error: the key store does not read")
	require.Contains(t, stderr.String(), "the key of 02:00:00:00:00:01 must be 64 lower-case hexadecimal digits")
}

func TestRunHTTP(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/register" {
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"type":"register","status":"registered","confirmation_id":"550e8400-e29b-41d4-a716-446655440000"}`))
			return
		}
		var b struct {
			BatchID string `json:"batch_id"`
		}
		buf := new(bytes.Buffer)
		_, _ = buf.ReadFrom(r.Body)
		_ = json.Unmarshal(buf.Bytes(), &b)
		_, _ = w.Write([]byte(`{"status":"ok","summary":{"received":1,"accepted":1,"duplicates":0,"rejected":0},` +
			`"results":[{"batch_id":"` + b.BatchID + `","status":"accepted","reason":null,"message":null}]}`))
	}))
	defer srv.Close()

	report := filepath.Join(t.TempDir(), "report.jsonl")
	var stderr bytes.Buffer
	code := run([]string{"--http-url", srv.URL, "--devices", "2", "--interval", "20ms", "--batches", "2",
		"--report", report}, func(k string) string {
		if k == "DEVICESIM_API_KEY" {
			return "k"
		}
		return ""
	}, &stderr)
	require.Equal(t, 0, code, stderr.String())
	require.Contains(t, stderr.String(), "final summary")
	data, err := os.ReadFile(report)
	require.NoError(t, err)
	require.Len(t, strings.Split(strings.TrimSpace(string(data)), "\n"), 4)
}

// TestRunHTTPReboots runs bounded reboots over HTTP: every boot registers, and the final
// summary counts the reboots.
func TestRunHTTPReboots(t *testing.T) {
	var mu sync.Mutex
	boots := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		buf := new(bytes.Buffer)
		_, _ = buf.ReadFrom(r.Body)
		var b struct {
			BatchID string `json:"batch_id"`
			BootID  string `json:"boot_id"`
		}
		_ = json.Unmarshal(buf.Bytes(), &b)
		if r.URL.Path == "/v1/register" {
			mu.Lock()
			code := http.StatusOK
			if len(boots) == 0 {
				code = http.StatusCreated
			}
			boots[b.BootID] = true
			mu.Unlock()
			w.WriteHeader(code)
			_, _ = w.Write([]byte(`{"type":"register","status":"registered","confirmation_id":"550e8400-e29b-41d4-a716-446655440000"}`))
			return
		}
		_, _ = w.Write([]byte(`{"status":"ok","summary":{"received":1,"accepted":1,"duplicates":0,"rejected":0},` +
			`"results":[{"batch_id":"` + b.BatchID + `","status":"accepted","reason":null,"message":null}]}`))
	}))
	defer srv.Close()

	var stderr bytes.Buffer
	code := run([]string{"--http-url", srv.URL, "--api-key", "k", "--devices", "1", "--interval", "20ms",
		"--duration", "700ms", "--reboot-every", "150ms", "--reboots", "2", "--summary-every", "0"}, noEnv, &stderr)
	require.Equal(t, 0, code, stderr.String())
	require.Contains(t, stderr.String(), `msg="final summary" component=devicesim devices=1 reboots=2 registrations=3`)
	require.Equal(t, 2, strings.Count(stderr.String(), `msg="device rebooted"`))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, boots, 3, "a registration per boot, each with its own boot_id")
}
