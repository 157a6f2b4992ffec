package uplink_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/uplink"
)

// Every invalid setting is named in the error, as the operator wrote it.
func TestConfigErrorsNameTheSetting(t *testing.T) {
	require.NoError(t, uplink.Config{}.Validate())
	tests := []struct {
		name string
		cfg  uplink.Config
		want string
	}{
		{"request timeout", uplink.Config{RequestTimeout: -time.Second}, "uplink.request_timeout: must not be negative"},
		{"min backoff", uplink.Config{MinBackoff: -time.Second}, "uplink.min_backoff: must not be negative"},
		{"max backoff", uplink.Config{MaxBackoff: -time.Second}, "uplink.max_backoff: must not be negative"},
		{"poll interval", uplink.Config{PollInterval: -time.Second}, "uplink.poll_interval: must not be negative"},
		{"backoffs crossed", uplink.Config{MinBackoff: time.Minute, MaxBackoff: time.Second}, "uplink.min_backoff: must not exceed uplink.max_backoff"},
		{"retention", uplink.Config{ReadingsRetention: -time.Hour}, "uplink.readings_retention: must not be negative"},
		{"max wait", uplink.Config{MaxWait: -time.Millisecond}, "uplink.max_wait: must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.EqualError(t, tt.cfg.Validate(), tt.want)
		})
	}
}
