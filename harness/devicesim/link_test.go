package devicesim

import (
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBackoff(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	lo, hi := time.Second, 8*time.Second
	tests := []struct {
		failures int
		max      time.Duration
	}{
		{1, time.Second}, {2, 2 * time.Second}, {3, 4 * time.Second}, {4, 8 * time.Second},
		{5, 8 * time.Second}, {1000, 8 * time.Second},
	}
	for _, tt := range tests {
		for range 100 {
			d := backoff(tt.failures, lo, hi, rng)
			require.GreaterOrEqual(t, d, tt.max/2, "failures=%d", tt.failures)
			require.LessOrEqual(t, d, tt.max, "failures=%d", tt.failures)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		in   string
		want time.Duration
	}{
		{"absent", "", 0},
		{"seconds", "3", 3 * time.Second},
		{"zero", "0", 0},
		{"negative", "-5", 0},
		{"capped", "86400", maxRetryAfter},
		{"date", now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{"date in the past", now.Add(-time.Hour).Format(http.TimeFormat), 0},
		{"garbage", "soon", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, parseRetryAfter(tt.in, now))
		})
	}
}
