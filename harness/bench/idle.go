//go:build linux

package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// idleRun is the memory of one gatewayd with a fleet connected and idle.
type idleRun struct {
	Binary string `json:"binary"`
	// Samples are keyed by the moment: "no device", "idle 2s" (two
	// seconds after every device's first batch was answered) and
	// "idle settled" (IdleSettle after it).
	Samples map[string]memoryBreakdown `json:"samples"`
}

// memoryBreakdown is where a process's resident memory goes.
type memoryBreakdown struct {
	Proc memory `json:"proc"`
	// Mappings is the resident size of the process's mappings by kind:
	// anonymous (the Go heap and stacks, Badger's arenas), Badger's
	// tables (.sst), value log (.vlog) and memtable logs (.mem), the
	// gatewayd binary, other files.
	Mappings map[string]int64 `json:"mappings_rss_bytes"`
	// Go is the Go runtime's accounting (runtime/metrics' memory classes,
	// as the go_memstats_* metrics report them).
	Go goClasses `json:"go"`
	// HeapByOwner is the in-use heap (sampled profile, after a GC) by the
	// package that allocated it.
	HeapByOwner map[string]int64 `json:"heap_inuse_by_owner_bytes"`
	// HeapTop are the largest in-use allocation sites.
	HeapTop []string `json:"heap_top"`
	// Releases counts gateway_memory_releases_total.
	Releases float64 `json:"memory_releases"`
}

// goClasses are the Go runtime's memory classes, in bytes.
type goClasses struct {
	HeapObjects  float64 `json:"heap_objects"`  // live and not yet swept objects
	HeapUnused   float64 `json:"heap_unused"`   // in spans in use, no object
	HeapFree     float64 `json:"heap_free"`     // free, still resident
	HeapReleased float64 `json:"heap_released"` // returned to the system
	Stacks       float64 `json:"stacks"`        // goroutine stacks
	OSStacks     float64 `json:"os_stacks"`     // thread stacks
	Metadata     float64 `json:"metadata"`      // spans, mcaches, GC
	Other        float64 `json:"other"`         // profiling buckets, the rest
	Goroutines   float64 `json:"goroutines"`
	NextGC       float64 `json:"next_gc"`
}

// idle connects the largest fleet to gatewayd, has every device send one
// batch, and breaks down gatewayd's memory while the fleet idles; with
// IdleBaselineBin it measures that gatewayd the same way first.
func (r *runner) idle(ctx context.Context) error {
	n := r.cfg.maxDevices()
	section := fmt.Sprintf("idle %d devices", n)
	bins := []string{r.bin}
	if r.cfg.IdleBaselineBin != "" {
		bins = []string{r.cfg.IdleBaselineBin, r.bin}
	}
	var runs []idleRun
	for i, bin := range bins {
		run, err := r.idleRun(ctx, bin, fmt.Sprintf("idle-%d-%d", n, i), n)
		if err != nil {
			return err
		}
		runs = append(runs, run)
	}
	r.res.Details[section] = runs
	cur := runs[len(runs)-1]
	base := idleRun{Samples: map[string]memoryBreakdown{}}
	baseName := ""
	if len(runs) == 2 {
		base, baseName = runs[0], "gatewayd "+filepath.Base(runs[0].Binary)
	}
	for _, at := range []string{"idle 2s", "idle settled"} {
		c, b := cur.Samples[at], base.Samples[at]
		var t *target
		if at == "idle settled" {
			t = atMost(64, "MB")
		}
		r.res.add(section, "RSS, "+at, "MB", mb(c.Proc.RSS), mb(b.Proc.RSS), baseName, t)
		r.res.add(section, "  anonymous, "+at, "MB", mb(c.Proc.Anon), mb(b.Proc.Anon), baseName, nil)
		r.res.add(section, "  mapped files, "+at, "MB", mb(c.Proc.File), mb(b.Proc.File), baseName, nil)
		r.res.add(section, "  Go heap objects, "+at, "MB", c.Go.HeapObjects/(1<<20), b.Go.HeapObjects/(1<<20), baseName, nil)
		r.res.add(section, "  Go heap unused + free (resident), "+at, "MB", (c.Go.HeapUnused+c.Go.HeapFree)/(1<<20),
			(b.Go.HeapUnused+b.Go.HeapFree)/(1<<20), baseName, nil)
		r.res.add(section, "  goroutine stacks, "+at, "MB", c.Go.Stacks/(1<<20), b.Go.Stacks/(1<<20), baseName, nil)
		r.res.add(section, "  Go metadata + other + OS stacks, "+at, "MB", (c.Go.Metadata+c.Go.Other+c.Go.OSStacks)/(1<<20),
			(b.Go.Metadata+b.Go.Other+b.Go.OSStacks)/(1<<20), baseName, nil)
	}
	for i, run := range runs {
		for _, at := range []string{"no device", "idle 2s", "idle settled"} {
			r.res.note("%s, %s, %s: %s", section, filepath.Base(run.Binary)+fmt.Sprint("#", i), at, run.Samples[at].String())
		}
	}
	return nil
}

// idleSources is how many loopback addresses the idle fleet connects
// from (4 devices to an address with 1,000 devices); every device opens
// its connection at once, as a fleet does when its access point returns.
const idleSources = 250

// idleRun measures one gatewayd binary.
func (r *runner) idleRun(ctx context.Context, bin, name string, n int) (idleRun, error) {
	run := idleRun{Binary: bin, Samples: map[string]memoryBreakdown{}}
	r.log.Info("idle: gatewayd", "binary", bin, "devices", n, "settle", r.cfg.IdleSettle)
	g, _, err := r.startIngestGatewayBin(ctx, name, bin)
	if err != nil {
		return run, err
	}
	defer g.proc.Kill()
	sample := func(at string) error {
		b, err := r.breakdown(ctx, g, strings.ReplaceAll(name+"-"+at, " ", "-"))
		run.Samples[at] = b
		return err
	}
	sleepCtx(ctx, time.Second)
	if err := sample("no device"); err != nil {
		return run, err
	}
	f, err := connectFleet(ctx, fleetSpec{addr: g.mqttAddr, fleet: r.nextFleet(), devices: n,
		readings: r.cfg.Readings, key: r.key, waitAck: true, sources: idleSources, parallel: n})
	if err != nil {
		return run, err
	}
	defer f.disconnect()
	if _, err := f.prime(ctx); err != nil {
		return run, err
	}
	primed := time.Now()
	sleepCtx(ctx, 2*time.Second)
	if err := sample("idle 2s"); err != nil {
		return run, err
	}
	sleepCtx(ctx, time.Until(primed.Add(r.cfg.IdleSettle)))
	if err := sample("idle settled"); err != nil {
		return run, err
	}
	held := f.held()
	r.log.Info("idle: devices held", "held", held, "devices", n, "sources", idleSources)
	if held < n {
		return run, fmt.Errorf("idle: only %d of %d devices still connected after %s (%d lost)", held, n, r.cfg.IdleSettle, f.lost.Load())
	}
	f.disconnect()
	return run, g.stop()
}

// startIngestGatewayBin is startIngestGateway with another gatewayd binary.
func (r *runner) startIngestGatewayBin(ctx context.Context, name, bin string) (*gatewayd, string, error) {
	saved := r.bin
	r.bin = bin
	defer func() { r.bin = saved }()
	return r.startIngestGateway(ctx, name)
}

// breakdown samples gatewayd's memory. Its heap profile is fetched first
// and forces a GC; /proc and the runtime's figures are read before it, so
// that they are what the process held on its own.
func (r *runner) breakdown(ctx context.Context, g *gatewayd, name string) (memoryBreakdown, error) {
	var b memoryBreakdown
	var err error
	if b.Proc, err = procMemory(g.pid()); err != nil {
		return b, err
	}
	if b.Mappings, err = mappingsRSS(g.pid()); err != nil {
		return b, err
	}
	m, err := g.metrics(ctx)
	if err != nil {
		return b, err
	}
	b.Go = goClasses{
		HeapObjects:  m.sum("go_memstats_heap_alloc_bytes"),
		HeapUnused:   m.sum("go_memstats_heap_inuse_bytes") - m.sum("go_memstats_heap_alloc_bytes"),
		HeapFree:     m.sum("go_memstats_heap_idle_bytes") - m.sum("go_memstats_heap_released_bytes"),
		HeapReleased: m.sum("go_memstats_heap_released_bytes"),
		Stacks:       m.sum("go_memstats_stack_inuse_bytes"),
		OSStacks:     m.sum("go_memstats_stack_sys_bytes") - m.sum("go_memstats_stack_inuse_bytes"),
		Metadata:     m.sum("go_memstats_mspan_sys_bytes") + m.sum("go_memstats_mcache_sys_bytes") + m.sum("go_memstats_gc_sys_bytes"),
		Other:        m.sum("go_memstats_other_sys_bytes") + m.sum("go_memstats_buck_hash_sys_bytes"),
		Goroutines:   m.sum("go_goroutines"),
		NextGC:       m.sum("go_memstats_next_gc_bytes"),
	}
	b.Releases = m.sum("gateway_memory_releases_total")
	prof := filepath.Join(r.work, "heap-"+name+".pb.gz")
	if err := g.saveHeapProfile(ctx, prof); err != nil {
		return b, err
	}
	b.HeapByOwner, b.HeapTop, err = heapOwners(ctx, prof)
	return b, err
}

func (b memoryBreakdown) String() string {
	owners := make([]string, 0, len(b.HeapByOwner))
	for k := range b.HeapByOwner {
		owners = append(owners, k)
	}
	sort.Slice(owners, func(i, j int) bool { return b.HeapByOwner[owners[i]] > b.HeapByOwner[owners[j]] })
	var heap []string
	for _, k := range owners {
		heap = append(heap, fmt.Sprintf("%s %.1f", k, mb(b.HeapByOwner[k])))
	}
	kinds := make([]string, 0, len(b.Mappings))
	for k := range b.Mappings {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var maps []string
	for _, k := range kinds {
		maps = append(maps, fmt.Sprintf("%s %.1f", k, mb(b.Mappings[k])))
	}
	g := b.Go
	return fmt.Sprintf("RSS %.1f MB (anon %.1f, files %.1f: %s); Go: heap objects %.1f, unused %.1f, free %.1f, released %.1f, "+
		"stacks %.1f (%d goroutines), OS stacks %.1f, metadata %.1f, other %.1f, next GC %.1f; releases %.0f; "+
		"heap in use by owner (MB, sampled): %s; top: %s",
		mb(b.Proc.RSS), mb(b.Proc.Anon), mb(b.Proc.File), strings.Join(maps, ", "),
		g.HeapObjects/(1<<20), g.HeapUnused/(1<<20), g.HeapFree/(1<<20), g.HeapReleased/(1<<20),
		g.Stacks/(1<<20), int(g.Goroutines), g.OSStacks/(1<<20), g.Metadata/(1<<20), g.Other/(1<<20), g.NextGC/(1<<20),
		b.Releases, strings.Join(heap, ", "), strings.Join(b.HeapTop, "; "))
}

// mappingsRSS sums the resident size of pid's mappings by kind.
func mappingsRSS(pid int) (map[string]int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int64{}
	kind := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if !strings.HasSuffix(fields[0], ":") { // a mapping's header: range perms offset dev inode [path]
			path := ""
			if len(fields) >= 6 {
				path = fields[5]
			}
			kind = mappingKind(path)
			continue
		}
		if fields[0] == "Rss:" && len(fields) == 3 {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("parsing /proc/%d/smaps: %q", pid, line)
			}
			out[kind] += kb << 10
		}
	}
	return out, sc.Err()
}

func mappingKind(path string) string {
	switch {
	case path == "" || strings.HasPrefix(path, "["):
		return "anonymous"
	case strings.HasSuffix(path, ".sst"):
		return "badger .sst"
	case strings.HasSuffix(path, ".vlog"):
		return "badger .vlog"
	case strings.HasSuffix(path, ".mem"):
		return "badger .mem"
	case filepath.Base(path) == "gatewayd":
		return "gatewayd binary"
	}
	return "other files"
}

// heapOwnerPatterns attribute a heap profile's functions to owners, first
// match wins.
var heapOwnerPatterns = []struct {
	owner string
	re    *regexp.Regexp
}{
	{"badger memtables", regexp.MustCompile(`badger/v4/skl\.`)},
	{"badger caches", regexp.MustCompile(`ristretto`)},
	{"badger other", regexp.MustCompile(`dgraph-io/`)},
	{"mochi", regexp.MustCompile(`mochi-mqtt/`)},
	{"aws sdk", regexp.MustCompile(`aws/|smithy`)},
	{"gateway", regexp.MustCompile(`^greenhouse-gateway/`)},
	{"bufio", regexp.MustCompile(`^bufio\.`)},
}

var pprofLine = regexp.MustCompile(`^\s*([0-9.]+)([kMG]?B)\s+\S+%\s+\S+%\s+\S+\s+\S+%\s+(.+)$`)

// heapOwners reads a heap profile's in-use space by function (flat) with
// go tool pprof and sums it by owner.
func heapOwners(ctx context.Context, prof string) (map[string]int64, []string, error) {
	cmd := exec.CommandContext(ctx, "go", "tool", "pprof", "-sample_index=inuse_space", "-top", "-nodecount=500", prof)
	out, err := cmd.Output()
	if err != nil {
		return nil, nil, fmt.Errorf("go tool pprof %s: %w", prof, err)
	}
	owners, top := parsePprofTop(string(out))
	return owners, top, nil
}

// parsePprofTop sums the flat column of go tool pprof -top by owner and
// returns the first lines too.
func parsePprofTop(out string) (map[string]int64, []string) {
	owners := map[string]int64{}
	var top []string
	for _, line := range strings.Split(out, "\n") {
		m := pprofLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[1], 64)
		if err != nil || v == 0 {
			continue
		}
		bytes := int64(v * map[string]float64{"B": 1, "kB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}[m[2]])
		fn := strings.TrimSpace(m[3])
		owner := "other"
		for _, p := range heapOwnerPatterns {
			if p.re.MatchString(fn) {
				owner = p.owner
				break
			}
		}
		owners[owner] += bytes
		if len(top) < 8 {
			top = append(top, fmt.Sprintf("%s %.1f MB", fn, mb(bytes)))
		}
	}
	return owners, top
}
