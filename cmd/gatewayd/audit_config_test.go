package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestAuditSettingsFromFileAndEnvironment(t *testing.T) {
	file := writeFile(t, "audit:\n  retention: 48h\n  segment_bytes: 65536\n")
	cfg, _, unknown, err := loadConfig([]string{"--config", file},
		[]string{"GATEWAY_AUDIT_MAX_BYTES=1048576", "GATEWAY_AUDIT_QUEUE_RECORDS=64"})
	require.NoError(t, err)
	require.Empty(t, unknown)
	require.Equal(t, 48*time.Hour, cfg.Audit.Retention)
	require.EqualValues(t, 65536, cfg.Audit.SegmentBytes)
	require.EqualValues(t, 1048576, cfg.Audit.MaxBytes)
	require.Equal(t, 64, cfg.Audit.QueueRecords)

	cfg, _, _, err = loadConfig(nil, nil)
	require.NoError(t, err)
	require.Equal(t, 7*24*time.Hour, cfg.Audit.Retention, "default")
	require.EqualValues(t, 64<<20, cfg.Audit.MaxBytes, "default")

	tests := []struct {
		name string
		env  []string
		want string
	}{
		{"segment over half the cap", []string{"GATEWAY_AUDIT_MAX_BYTES=1048576", "GATEWAY_AUDIT_SEGMENT_BYTES=1048576"}, "audit.segment_bytes"},
		{"retention too short", []string{"GATEWAY_AUDIT_RETENTION=1m"}, "audit.retention: must be at least 1h"},
		{"not a size", []string{"GATEWAY_AUDIT_MAX_BYTES=lots"}, "GATEWAY_AUDIT_MAX_BYTES (audit.max_bytes)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, _, err := loadConfig(nil, tt.env)
			require.ErrorContains(t, err, tt.want)
		})
	}
}
