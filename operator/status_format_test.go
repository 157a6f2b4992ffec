package operator

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHumanFormats(t *testing.T) {
	bytesCases := []struct {
		n    int64
		want string
	}{
		{0, "0 B"}, {1023, "1023 B"}, {1024, "1.0 KiB"}, {3355443, "3.2 MiB"}, {1 << 30, "1.0 GiB"},
		{5 << 40, "5.0 TiB"}, {3 << 50, "3072.0 TiB"}, {-2048, "-2.0 KiB"},
	}
	for _, c := range bytesCases {
		require.Equal(t, c.want, humanBytes(c.n), "humanBytes(%d)", c.n)
	}
	countCases := []struct {
		n    int64
		want string
	}{
		{0, "0"}, {999, "999"}, {1000, "1,000"}, {1234567, "1,234,567"}, {-12345, "-12,345"},
	}
	for _, c := range countCases {
		require.Equal(t, c.want, humanCount(c.n), "humanCount(%d)", c.n)
	}
	durationCases := []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"}, {45 * time.Second, "45s"}, {4 * time.Minute, "4m"}, {4*time.Minute + 10*time.Second, "4m 10s"},
		{3*time.Hour + 12*time.Minute + 59*time.Second, "3h 12m"}, {50 * time.Hour, "2d 2h"}, {-90 * time.Second, "1m 30s"},
	}
	for _, c := range durationCases {
		require.Equal(t, c.want, humanDuration(c.d), "humanDuration(%s)", c.d)
	}
	ageCases := []struct {
		d    time.Duration
		want string
	}{
		{0, "just now"}, {999 * time.Millisecond, "just now"}, {4 * time.Minute, "4m ago"}, {-2 * time.Minute, "in 2m"},
	}
	for _, c := range ageCases {
		require.Equal(t, c.want, humanAge(c.d), "humanAge(%s)", c.d)
	}
	offsetCases := []struct {
		s    float64
		want string
	}{
		{0, "0s"}, {3, "+3s"}, {-3720, "-1h 2m"},
	}
	for _, c := range offsetCases {
		require.Equal(t, c.want, humanOffset(c.s), "humanOffset(%v)", c.s)
	}
	require.Equal(t, "1 batch", plural(1, "batch", "batches"))
	require.Equal(t, "2,000 batches", plural(2000, "batch", "batches"))
	require.Equal(t, "7", countAny(7))
	require.Equal(t, "18,446,744,073", countAny(uint64(18446744073)))
}
