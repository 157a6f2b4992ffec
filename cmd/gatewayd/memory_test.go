package main

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

func TestMemoryReleaseIntervalSetting(t *testing.T) {
	tests := []struct {
		name string
		file string
		env  []string
		want time.Duration
	}{
		{"default", "", nil, defaultMemoryReleaseInterval},
		{"file", "memory_release_interval: 2m\n", nil, 2 * time.Minute},
		{"environment beats file", "memory_release_interval: 2m\n", []string{"GATEWAY_MEMORY_RELEASE_INTERVAL=0s"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, _, _, err := loadConfig([]string{"--config", writeFile(t, tt.file)}, tt.env)
			require.NoError(t, err)
			require.Equal(t, tt.want, cfg.MemoryReleaseInterval)
		})
	}
	bad := []struct{ file, err string }{
		{"memory_release_interval: 500ms\n", "memory_release_interval: 500ms is below 1s"},
		{"memory_release_interval: -1s\n", "memory_release_interval: must not be negative"},
	}
	for _, b := range bad {
		_, _, _, err := loadConfig([]string{"--config", writeFile(t, b.file)}, nil)
		require.ErrorContains(t, err, b.err)
	}
}

// scriptedAllocs answers the releaser's reads of the allocated bytes from a
// script, one value a read, and records the reads.
type scriptedAllocs struct {
	mu     sync.Mutex
	values []uint64
	reads  int
}

func (s *scriptedAllocs) read() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.values[min(s.reads, len(s.values)-1)]
	s.reads++
	return v
}

func TestMemoryReleaserReleasesOnlyWhenIdle(t *testing.T) {
	const interval = 5 * time.Millisecond
	idle := uint64(interval.Seconds() * idleAllocRate)
	// Reads: the start, then one per tick (and one more after a release).
	allocs := &scriptedAllocs{values: []uint64{
		0,
		100 << 20,        // tick 1: 100 MiB allocated, busy
		200 << 20,        // tick 2: busy
		200<<20 + idle/2, // tick 3: idle: released
		200<<20 + idle/2, // after the release
	}}
	reg := prometheus.NewRegistry()
	m := newMemoryReleaser(interval, nil, reg)
	m.allocated = allocs.read
	released := make(chan int, 1)
	m.release = func() {
		allocs.mu.Lock()
		reads := allocs.reads
		allocs.mu.Unlock()
		select {
		case released <- reads:
		default:
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	select {
	case reads := <-released:
		require.Equal(t, 4, reads, "released at the first idle tick, after two busy ones")
	case <-time.After(10 * time.Second):
		t.Fatal("no release within 10s")
	}
	cancel()
	require.NoError(t, <-done)
	require.GreaterOrEqual(t, testutil.ToFloat64(m.releases), 1.0)
}

func TestMemoryReleaserOff(t *testing.T) {
	m := newMemoryReleaser(0, nil, nil)
	m.release = func() { t.Error("released with the release off") }
	require.NoError(t, m.Run(context.Background()), "returns at once")
}

// grow uses about n KiB of stack.
//
//go:noinline
func grow(n int) byte {
	var pad [1000]byte
	if n > 0 {
		pad[n%len(pad)] = grow(n - 1)
	}
	return pad[0]
}

func TestReleaseMemoryShrinksStacksFully(t *testing.T) {
	const n = 200
	stop := make(chan struct{})
	var parked sync.WaitGroup
	parked.Add(n)
	for range n {
		go func() {
			grow(24) // grows the stack to 32 KiB
			parked.Done()
			<-stop
		}()
	}
	parked.Wait()
	defer close(stop)
	before := stackBytes()
	releaseMemory()
	after := stackBytes()
	t.Logf("stacks of %d parked goroutines: %d bytes before the release, %d after", n, before, after)
	// One collection halves each stack at most (32 to 16 KiB); the release
	// collects three times, down to 4 KiB each.
	require.Less(t, int64(after), int64(before)/4)
}

// stackBytes returns the memory of goroutine stacks.
func stackBytes() uint64 { return runtimeMetric("/memory/classes/heap/stacks:bytes") }
