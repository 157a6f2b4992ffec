package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHistoryRetentionFromFileAndEnvironment(t *testing.T) {
	tests := []struct {
		name string
		file string
		env  []string
		want time.Duration
	}{
		{"default", "", nil, 24 * time.Hour},
		{"file", "buffer:\n  history_retention: 2h\n", nil, 2 * time.Hour},
		{"environment beats file", "buffer:\n  history_retention: 2h\n", []string{"GATEWAY_BUFFER_HISTORY_RETENTION=-1s"}, -time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := append([]string{"GATEWAY_API_KEY_PEPPER=x"}, tt.env...)
			cfg, _, unknown, err := loadConfig([]string{"--config", writeFile(t, tt.file)}, env)
			require.NoError(t, err)
			require.Empty(t, unknown)
			require.Equal(t, tt.want, cfg.Buffer.HistoryRetention)
		})
	}
	_, _, _, err := loadConfig([]string{"--config", writeFile(t, "")},
		[]string{"GATEWAY_API_KEY_PEPPER=x", "GATEWAY_BUFFER_HISTORY_RETENTION=a day"})
	require.ErrorContains(t, err, "GATEWAY_BUFFER_HISTORY_RETENTION (buffer.history_retention)")
}
