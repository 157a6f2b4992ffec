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

	cfg, _, _, err = loadConfig(nil, []string{"GATEWAY_AUDIT_MAX_RECORDS_PER_SECOND=5", "GATEWAY_AUDIT_BURST_RECORDS=50",
		"GATEWAY_AUDIT_AGGREGATE_INTERVAL=1m", "GATEWAY_AUDIT_MAX_AGGREGATE_KEYS=32"})
	require.NoError(t, err)
	require.Equal(t, 5, cfg.Audit.MaxRecordsPerSecond)
	require.Equal(t, 50, cfg.Audit.BurstRecords)
	require.Equal(t, time.Minute, cfg.Audit.AggregateInterval)
	require.Equal(t, 32, cfg.Audit.MaxAggregateKeys)

	cfg, _, _, err = loadConfig(nil, nil)
	require.NoError(t, err)
	require.Equal(t, 7*24*time.Hour, cfg.Audit.Retention, "default")
	require.EqualValues(t, 16<<20, cfg.Audit.MaxBytes, "default")

	tests := []struct {
		name string
		env  []string
		want string
	}{
		{"segment over half the cap", []string{"GATEWAY_AUDIT_MAX_BYTES=1048576", "GATEWAY_AUDIT_SEGMENT_BYTES=1048576"}, "audit.segment_bytes"},
		{"retention too short", []string{"GATEWAY_AUDIT_RETENTION=1m"}, "audit.retention: must be at least 1h"},
		{"not a size", []string{"GATEWAY_AUDIT_MAX_BYTES=lots"}, "GATEWAY_AUDIT_MAX_BYTES (audit.max_bytes)"},
		{"interval too short", []string{"GATEWAY_AUDIT_AGGREGATE_INTERVAL=10ms"}, "audit.aggregate_interval: must be between 1s and 1h"},
		{"negative rate", []string{"GATEWAY_AUDIT_MAX_RECORDS_PER_SECOND=-1"}, "audit.max_records_per_second"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, _, err := loadConfig(nil, tt.env)
			require.ErrorContains(t, err, tt.want)
		})
	}
}
