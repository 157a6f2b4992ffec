//go:build linux

package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// readyCache is the cached data directory of the time-to-ready figure.
type readyCache struct {
	Stamp   string  `json:"stamp"`
	Backlog backlog `json:"backlog"`
	Built   string  `json:"built_at"`
}

// footprintRun is the detail of the footprint scenario.
type footprintRun struct {
	Cache          readyCache `json:"cache"`
	CacheReused    bool       `json:"cache_reused"`
	DataDir        diskUsage  `json:"data_dir"`
	ReadySeconds   []float64  `json:"ready_s"`
	EmptySeconds   []float64  `json:"ready_empty_s"`
	CopySeconds    float64    `json:"copy_s_each"`
	MemoryAtReady  memory     `json:"memory_after_ready"`
	CanonicalBytes float64    `json:"canonical_bytes_per_reading"`
	Live           *liveDisk  `json:"live_after_mqtt,omitempty"`
}

// footprint measures the time to ready with ReadyReadings pending and the
// bytes on disk per buffered reading.
func (r *runner) footprint(ctx context.Context) error {
	var run footprintRun
	run.CanonicalBytes = r.canonicalPerReading
	data, cache, reused, err := r.readyData(ctx)
	if err != nil {
		return err
	}
	run.Cache, run.CacheReused = cache, reused
	if run.DataDir, err = dirUsage(data); err != nil {
		return err
	}
	for i := range r.cfg.ReadyRuns {
		dir := filepath.Join(r.work, fmt.Sprintf("ready-%d", i))
		begin := time.Now()
		if err := copyDir(data, dir); err != nil {
			return err
		}
		run.CopySeconds = time.Since(begin).Seconds()
		ready, mem, err := r.timeToReady(ctx, dir, fmt.Sprintf("ready-%d", i))
		if err != nil {
			return err
		}
		run.ReadySeconds = append(run.ReadySeconds, ready)
		run.MemoryAtReady = mem
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
		empty, _, err := r.timeToReady(ctx, filepath.Join(r.work, fmt.Sprintf("empty-%d", i)), fmt.Sprintf("empty-%d", i))
		if err != nil {
			return err
		}
		run.EmptySeconds = append(run.EmptySeconds, empty)
	}
	run.Live = r.liveDisk
	r.res.Details["footprint"] = run

	readings := float64(cache.Backlog.Readings)
	r.res.add("footprint", fmt.Sprintf("time to ready, %s readings pending (median of %d)", count(cache.Backlog.Readings), r.cfg.ReadyRuns),
		"s", median(run.ReadySeconds), median(run.EmptySeconds), "gatewayd, empty data dir", below(2, "s"))
	r.res.add("footprint", fmt.Sprintf("disk per buffered reading, %s pending", count(cache.Backlog.Readings)), "B",
		float64(run.DataDir.Allocated)/readings, run.CanonicalBytes, "canonical JSON per reading", nil)
	if l := r.liveDisk; l != nil && l.Readings > 0 {
		r.res.add("footprint", fmt.Sprintf("disk per buffered reading, live after MQTT (%s pending)", count(int(l.Readings))), "B",
			float64(l.Usage.Allocated)/float64(l.Readings), run.CanonicalBytes, "canonical JSON per reading", nil)
	}
	r.res.note("time to ready: process start to the first /readyz 200 (polled every 5 ms), on a copy of the cached "+
		"data directory (%.0f MB allocated, %.0f MB apparent; page cache warm from the copy); runs %v s, empty %v s",
		mb(run.DataDir.Allocated), mb(run.DataDir.Apparent), run.ReadySeconds, run.EmptySeconds)
	return nil
}

// timeToReady starts gatewayd on dir with an unreachable DynamoDB and
// returns the time to /readyz and its memory then.
func (r *runner) timeToReady(ctx context.Context, dir, name string) (float64, memory, error) {
	g, err := startGatewayd(ctx, gatewaydSpec{bin: r.bin, dataDir: dir, endpoint: r.closed, prefix: "nowhere_",
		logPath: filepath.Join(r.work, "gatewayd-"+name+".log"), env: r.env()})
	if err != nil {
		return 0, memory{}, err
	}
	mem, err := procMemory(g.pid())
	if err != nil {
		g.proc.Kill()
		return 0, memory{}, err
	}
	return g.ready.Seconds(), mem, g.stop()
}

// readyData returns the cached data directory with ReadyReadings pending,
// building it when it is missing or was built by another buffer package.
func (r *runner) readyData(ctx context.Context) (string, readyCache, bool, error) {
	batches := r.cfg.ReadyReadings / r.cfg.Readings
	devices := r.cfg.maxDevices()
	stamp, err := bufferStamp(r.root, fmt.Sprintf("%d/%d/%d", batches, r.cfg.Readings, devices))
	if err != nil {
		return "", readyCache{}, false, err
	}
	name := fmt.Sprintf("ready-%d-%s", batches*r.cfg.Readings, stamp)
	dir := filepath.Join(r.cfg.CacheDir, name)
	meta := filepath.Join(dir, "cache.json")
	var c readyCache
	if raw, err := os.ReadFile(meta); err == nil && json.Unmarshal(raw, &c) == nil && c.Stamp == stamp {
		return filepath.Join(dir, "data"), c, true, nil
	}
	// Remove caches of other versions and any half-built one.
	old, _ := filepath.Glob(filepath.Join(r.cfg.CacheDir, "ready-*"))
	for _, o := range old {
		if err := os.RemoveAll(o); err != nil {
			return "", c, false, err
		}
	}
	if err := r.ensureCacheDir(); err != nil {
		return "", c, false, err
	}
	r.log.Info("footprint: building the time-to-ready data directory (cached for later runs)",
		"dir", dir, "batches", batches, "readings", batches*r.cfg.Readings)
	bl, err := fillBacklog(ctx, filepath.Join(dir, "data"), 0xF0, devices, batches, r.cfg.Readings)
	if err != nil {
		return "", c, false, err
	}
	c = readyCache{Stamp: stamp, Backlog: bl, Built: time.Now().UTC().Format(time.RFC3339)}
	raw, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return "", c, false, err
	}
	if err := os.WriteFile(meta, raw, 0o644); err != nil {
		return "", c, false, err
	}
	return filepath.Join(dir, "data"), c, false, nil
}

// ensureCacheDir creates the cache directory with a .gitignore that keeps
// its content out of git.
func (r *runner) ensureCacheDir() error {
	if err := os.MkdirAll(r.cfg.CacheDir, 0o750); err != nil {
		return err
	}
	ignore := filepath.Join(r.cfg.CacheDir, ".gitignore")
	if _, err := os.Stat(ignore); err == nil {
		return nil
	}
	return os.WriteFile(ignore, []byte("# Data directories cached by make bench; rebuilt when missing.\n*\n"), 0o644)
}

// count formats a number with thousands separators.
func count(n int) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
