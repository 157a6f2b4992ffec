package main

import (
	"context"
	"io"
	"log/slog"
	"math"
	"net/http"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMemoryLimitSetting(t *testing.T) {
	tests := []struct {
		name string
		file string
		env  []string
		want int64
	}{
		{"default", "", nil, defaultMemoryLimit},
		{"file", "memory_limit: 104857600\n", nil, 100 << 20},
		{"environment beats file", "memory_limit: 104857600\n", []string{"GATEWAY_MEMORY_LIMIT=0"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, _, _, err := loadConfig([]string{"--config", writeFile(t, tt.file)}, tt.env)
			require.NoError(t, err)
			require.Equal(t, tt.want, cfg.MemoryLimit)
		})
	}
	_, _, _, err := loadConfig([]string{"--config", writeFile(t, "memory_limit: 1000\n")}, nil)
	require.ErrorContains(t, err, "memory_limit: 1000 is below 32 MiB")
}

func TestApplyMemoryLimit(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	tests := []struct {
		name     string
		limit    int64
		environ  []string
		want     int64
		wantFrom string
	}{
		{"from the setting", 150 << 20, nil, 150 << 20, "memory_limit"},
		{"GOMEMLIMIT wins", 150 << 20, []string{"GOMEMLIMIT=200MiB"}, -1, envMemLimit},
		{"off", 0, nil, math.MaxInt64, "none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			debug.SetMemoryLimit(math.MaxInt64)
			got, from := applyMemoryLimit(tt.limit, tt.environ)
			require.Equal(t, tt.wantFrom, from)
			if tt.want == -1 {
				// The runtime applied GOMEMLIMIT at start (here it did
				// not: the test's environment has none); the setting is
				// left alone.
				require.Equal(t, int64(math.MaxInt64), debug.SetMemoryLimit(-1))
				return
			}
			require.Equal(t, tt.want, got)
			require.Equal(t, tt.want, debug.SetMemoryLimit(-1))
		})
	}
}

func TestPprofAddrSetting(t *testing.T) {
	cfg, _, _, err := loadConfig([]string{"--pprof-addr", "127.0.0.1:6060"}, nil)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:6060", cfg.Debug.PprofAddr)
	cfg, _, _, err = loadConfig(nil, []string{"GATEWAY_DEBUG_PPROF_ADDR=127.0.0.1:6061"})
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:6061", cfg.Debug.PprofAddr)
	_, _, _, err = loadConfig([]string{"--config", writeFile(t, "debug:\n  pprof_addr: localhost\n")}, nil)
	require.ErrorContains(t, err, "debug.pprof_addr")
}

func TestPprofServesProfiles(t *testing.T) {
	srv, err := listenPprof("", nil)
	require.NoError(t, err)
	require.Nil(t, srv, "off by default")
	require.NoError(t, srv.Run(context.Background()))

	srv, err = listenPprof("127.0.0.1:0", slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	resp, err := http.Get("http://" + srv.ln.Addr().String() + "/debug/pprof/heap?debug=1")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(body), "heap profile")
	cancel()
	require.NoError(t, <-done)
}
