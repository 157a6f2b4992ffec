package soak

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func samplesOf(load time.Duration, rss func(at time.Duration) float64) []memSample {
	var out []memSample
	for at := time.Duration(0); at < load; at += memorySampleEvery {
		out = append(out, memSample{at: at, rss: rss(at), goroutines: 60, files: 40})
	}
	return out
}

func TestJudgeMemory(t *testing.T) {
	load := time.Hour
	// Warm-up climbs to 90 MB, then it stays there with GC saw-teeth.
	flat := samplesOf(load, func(at time.Duration) float64 {
		base := min(float64(at)/float64(10*time.Minute), 1) * 90e6
		return base + float64(at/memorySampleEvery%7)*1e6
	})
	account, problems := judgeMemory(flat, load)
	require.Empty(t, problems, account)
	require.Contains(t, account, "after 15m0s of warm-up")
	// The saw-teeth are 0-6 MB over 90: the median is the tooth's middle.
	require.Contains(t, account, "(median 93.0;")

	// A slow leak: 1 MB a minute past warm-up.
	leak := samplesOf(load, func(at time.Duration) float64 { return 90e6 + float64(at/time.Minute)*1e6 })
	_, problems = judgeMemory(leak, load)
	require.Len(t, problems, 1)
	require.Contains(t, problems[0], "RSS peaks rose after warm-up")

	// Goroutines and files that pile up.
	piling := samplesOf(load, func(time.Duration) float64 { return 90e6 })
	for i := range piling {
		piling[i].goroutines = 60 + float64(i)/4
		piling[i].files = 40 + float64(i)/10
	}
	_, problems = judgeMemory(piling, load)
	require.Len(t, problems, 2, "%v", problems)

	// A Go heap that grows while RSS stays (the heap reusing what the
	// kernel counts already): 0.5 MB a minute.
	heapLeak := samplesOf(load, func(time.Duration) float64 { return 150e6 })
	for i := range heapLeak {
		heapLeak[i].heap = 40e6 + float64(heapLeak[i].at/time.Minute)*0.5e6
	}
	account, problems = judgeMemory(heapLeak, load)
	require.Len(t, problems, 1, "%v", problems)
	require.Contains(t, problems[0], "Go heap peaks rose after warm-up")
	require.Contains(t, account, "Go heap in use 54.5 MB")
	require.Contains(t, account, "Go heap in use 69.5 MB")

	// No samples after warm-up is a problem, not a pass.
	_, problems = judgeMemory(flat[:10], load)
	require.Len(t, problems, 1)
	require.Contains(t, problems[0], "too few samples")
}

func TestStatusKiB(t *testing.T) {
	status := "Name:\tgatewayd\nVmRSS:\t  153600 kB\nRssAnon:\t   98304 kB\nRssFile:\t   55296 kB\n"
	require.Equal(t, 98304.0, statusKiB(status, "RssAnon:"))
	require.Equal(t, 55296.0, statusKiB(status, "RssFile:"))
	require.Zero(t, statusKiB(status, "RssShmem:"))
}
