package soak

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The steady scenario's memory check. gatewayd's resident memory, Go heap
// in use, goroutines and open files are read from its /metrics (and the
// split of resident memory from /proc/PID/status) every memorySampleEvery
// while devices send. The first quarter of the load is warm-up (caches,
// memtables, the Go heap finding its size); the rest is cut in three
// windows, and a window's figure is its peak (each series' own maximum).
// Memory is flat when the last window's peak RSS and peak Go heap are each
// within 10% plus 8 MiB of the first's, goroutines within 50 and open files
// within 20: a leak of a few hundred bytes a batch over an hour's 72,000
// batches passes none of these.

const memorySampleEvery = 5 * time.Second

// memSample is one reading of gatewayd's /metrics and of its
// /proc/PID/status.
type memSample struct {
	at                time.Duration // since the load began
	rss               float64       // bytes
	goroutines, files float64
	// heap is the Go heap's spans in use; anon and file split rss into
	// anonymous memory (the heap, stacks, the runtime's own) and mapped
	// file pages (Badger's tables and value log, the binary), which the
	// kernel can drop; 0 when /proc could not be read.
	heap, anon, file float64
}

const (
	seriesRSS        = "process_resident_memory_bytes"
	seriesGoroutines = "go_goroutines"
	seriesFiles      = "process_open_fds"
	seriesHeap       = "go_memstats_heap_inuse_bytes"
)

// steady samples gatewayd until the load time is over, then judges the
// samples.
func (s *scenario) steady(ctx context.Context, until time.Time) {
	begin := time.Now()
	var samples []memSample
	warmSaved := false
	tick := time.NewTicker(memorySampleEvery)
	defer tick.Stop()
	for ctx.Err() == nil && time.Now().Before(until) {
		select {
		case <-ctx.Done():
		case <-tick.C:
			m, err := s.gw.metrics(seriesRSS, seriesGoroutines, seriesFiles, seriesHeap)
			if err != nil {
				s.problem("reading gatewayd's metrics: %v", err)
				continue
			}
			anon, file := residentSplit(s.gw.proc.Pid())
			at := time.Since(begin)
			samples = append(samples, memSample{at: at, rss: m[seriesRSS],
				goroutines: m[seriesGoroutines], files: m[seriesFiles], heap: m[seriesHeap], anon: anon, file: file})
			if !warmSaved && at >= s.load/4 {
				warmSaved = true
				s.saveHeapProfile("heap-after-warmup.pb.gz")
			}
		}
	}
	s.saveHeapProfile("heap-end.pb.gz")
	account, problems := judgeMemory(samples, s.load)
	s.fig.Memory = account
	for _, p := range problems {
		s.problem("%s", p)
	}
}

// window is one window's peaks.
type window struct {
	from, to          time.Duration
	rss               float64
	goroutines, files float64
	heap, anon, file  float64
	n                 int
	// all is every RSS sample of the window, for its median: the level
	// the peaks (Badger's flushes and compactions, each a burst of table
	// buffers) rise from.
	all []float64
}

// median is the window's median RSS sample (0 without samples).
func (w window) median() float64 {
	if len(w.all) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(w.all))
	return s[len(s)/2]
}

// judgeMemory cuts the samples after warm-up (a quarter of load) into
// three windows and compares the last's peaks with the first's. It
// returns the peaks as one line, and what is not flat.
func judgeMemory(samples []memSample, load time.Duration) (string, []string) {
	warm := load / 4
	span := max((load-warm)/3, time.Nanosecond)
	ws := make([]window, 3)
	for i := range ws {
		ws[i].from, ws[i].to = warm+time.Duration(i)*span, warm+time.Duration(i+1)*span
	}
	for _, m := range samples {
		if m.at < warm {
			continue
		}
		i := min(int((m.at-warm)/span), 2)
		w := &ws[i]
		w.rss, w.goroutines, w.files = max(w.rss, m.rss), max(w.goroutines, m.goroutines), max(w.files, m.files)
		w.heap, w.anon, w.file = max(w.heap, m.heap), max(w.anon, m.anon), max(w.file, m.file)
		w.n++
		w.all = append(w.all, m.rss)
	}
	var parts []string
	for _, w := range ws {
		parts = append(parts, fmt.Sprintf("%s-%s: RSS peak %.1f MB (median %.1f; peaks of its anonymous part %.1f, file pages %.1f), Go heap in use %.1f MB, "+
			"%g goroutines, %g open files (%d samples)",
			w.from.Round(time.Second), w.to.Round(time.Second), w.rss/1e6, w.median()/1e6, w.anon/1e6, w.file/1e6, w.heap/1e6,
			w.goroutines, w.files, w.n))
	}
	account := fmt.Sprintf("after %s of warm-up, %s", warm.Round(time.Second), strings.Join(parts, "; "))
	first, last := ws[0], ws[2]
	if first.n == 0 || last.n == 0 {
		return account, []string{"memory: too few samples after warm-up to compare (the load was cut short?)"}
	}
	var problems []string
	if limit := first.rss*1.10 + 8<<20; last.rss > limit {
		problems = append(problems, fmt.Sprintf("memory: RSS peaks rose after warm-up, %.1f MB to %.1f MB (more than 10%% + 8 MiB)",
			first.rss/1e6, last.rss/1e6))
	}
	if limit := first.heap*1.10 + 8<<20; last.heap > limit {
		problems = append(problems, fmt.Sprintf("memory: Go heap peaks rose after warm-up, %.1f MB to %.1f MB (more than 10%% + 8 MiB)",
			first.heap/1e6, last.heap/1e6))
	}
	if last.goroutines > first.goroutines+50 {
		problems = append(problems, fmt.Sprintf("memory: goroutines rose after warm-up, %g to %g", first.goroutines, last.goroutines))
	}
	if last.files > first.files+20 {
		problems = append(problems, fmt.Sprintf("memory: open files rose after warm-up, %g to %g", first.files, last.files))
	}
	return account, problems
}

// residentSplit reads the anonymous and file-backed parts of pid's
// resident memory (RssAnon, RssFile of /proc/PID/status), in bytes; 0, 0
// when they cannot be read.
func residentSplit(pid int) (anon, file float64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	return statusKiB(string(b), "RssAnon:") * 1024, statusKiB(string(b), "RssFile:") * 1024
}

// statusKiB is the value of /proc/PID/status's field name ("RssAnon:"),
// in KiB; 0 when absent.
func statusKiB(status, name string) float64 {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, name); ok {
			f, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return f
		}
	}
	return 0
}

// saveHeapProfile writes gatewayd's heap profile (its debug.pprof_addr,
// which the steady scenario sets) to name in the scenario's directory, so
// that with --keep, go tool pprof -base heap-after-warmup.pb.gz
// heap-end.pb.gz shows what grew. A failure is logged, not a problem.
func (s *scenario) saveHeapProfile(name string) {
	if s.gw.pprofAddr == "" {
		return
	}
	path := filepath.Join(s.dir, name)
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Get("http://" + s.gw.pprofAddr + "/debug/pprof/heap")
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET /debug/pprof/heap: %s", resp.Status)
	}
	if err == nil {
		var b []byte
		b, err = io.ReadAll(resp.Body)
		if err == nil {
			err = os.WriteFile(path, b, 0o644)
		}
	}
	if resp != nil {
		resp.Body.Close()
	}
	if err != nil {
		s.log.Warn("saving gatewayd's heap profile", "path", path, "err", err)
		return
	}
	s.log.Info("saved gatewayd's heap profile", "path", path)
}
