package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// defaultMemoryReleaseInterval is memory_release_interval's default.
const defaultMemoryReleaseInterval = 10 * time.Second

// idleAllocRate is the allocation rate, in bytes per second, below which
// the gateway counts as idle for the memory release. One batch of ten
// readings allocates about 10 KB on its way to the disk, so this is about
// a hundred batches a second; under load the release never runs.
const idleAllocRate = 1 << 20

// validateMemoryReleaseInterval checks the memory_release_interval setting.
func validateMemoryReleaseInterval(d time.Duration) error {
	if d < 0 {
		return errors.New("memory_release_interval: must not be negative (0 turns the release off)")
	}
	if d != 0 && d < time.Second {
		return fmt.Errorf("memory_release_interval: %s is below 1s (0 turns the release off)", d)
	}
	return nil
}

// memoryReleaser gives memory back to the operating system while the
// gateway idles. Go's garbage collector runs when the heap has doubled, or
// every two minutes, and the runtime returns free pages to the system only
// gradually, keeping about the heap goal resident; an idle gateway
// allocates little, so the memory its devices used while connecting and
// sending stays resident. Each interval in which less than idleAllocRate
// was allocated, the releaser collects and returns every free page
// (debug.FreeOSMemory). The collection also shrinks goroutine stacks that
// grew while busy (by half, where less than a quarter is in use), three
// times (releaseMemory): mochi runs two goroutines per device connection.
type memoryReleaser struct {
	interval time.Duration
	logger   *slog.Logger
	releases prometheus.Counter
	// allocated reads the bytes allocated since the process started.
	allocated func() uint64
	// release returns memory to the system.
	release func()
}

func newMemoryReleaser(interval time.Duration, logger *slog.Logger, reg prometheus.Registerer) *memoryReleaser {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	return &memoryReleaser{
		interval: interval,
		logger:   logger.With("component", "memory"),
		releases: promauto.With(reg).NewCounter(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "memory", Name: "releases_total",
			Help: "Times the gateway, idle, collected garbage and returned free memory to the operating system (memory_release_interval).",
		}),
		allocated: heapAllocated,
		release:   releaseMemory,
	}
}

// releaseCollections is how many collections one release makes.
const releaseCollections = 3

// releaseMemory collects garbage releaseCollections times and returns every
// free page to the system (debug.FreeOSMemory). A collection halves a
// goroutine stack at most, and an idle device's reader stack comes down
// from 32 KiB in three: with one collection per release, 1,000 idle devices
// held 20 MB of stacks instead of 13 MB until several releases had run. The
// runtime's count of stack memory lags the shrinking (freed stacks stay
// cached until a later collection), so it cannot tell when to stop. Each
// collection of an idle gateway's heap takes milliseconds.
func releaseMemory() {
	for range releaseCollections {
		debug.FreeOSMemory()
	}
}

// heapAllocated returns the bytes the Go heap allocated since the start.
func heapAllocated() uint64 { return runtimeMetric("/gc/heap/allocs:bytes") }

// runtimeMetric reads one runtime/metrics counter (0 if it is not one).
func runtimeMetric(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// Run releases memory after every idle interval until ctx is done; with a
// zero interval it returns at once.
func (m *memoryReleaser) Run(ctx context.Context) error {
	if m.interval <= 0 {
		return nil
	}
	t := time.NewTicker(m.interval)
	defer t.Stop()
	last := m.allocated()
	idle := uint64(m.interval.Seconds() * idleAllocRate)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		now := m.allocated()
		if now-last <= idle {
			m.release()
			m.releases.Inc()
			m.logger.Debug("memory returned to the system", "allocated_bytes", now-last)
			now = m.allocated()
		}
		last = now
	}
}
