//go:build linux

package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"greenhouse-gateway/harness/proc"
)

// gatewayd settings of the benchmark.
const (
	// pepper is the API key pepper of the benchmark's gateways and key.
	pepper = "bench-pepper"
	// awsRegion is the region of every client; DynamoDB Local ignores it.
	awsRegion = "us-east-1"
	// readyTimeout bounds the wait for /readyz.
	readyTimeout = 120 * time.Second
	// buildTimeout bounds go build.
	buildTimeout = 10 * time.Minute
)

// buildGatewayd builds cmd/gatewayd from the working tree into dir. Symbols
// are kept, so that perf can profile it.
func buildGatewayd(ctx context.Context, root, dir string) (string, error) {
	bin := filepath.Join(dir, "gatewayd")
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", bin, "./cmd/gatewayd")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/gatewayd: %w\n%s", err, out)
	}
	return bin, nil
}

// gatewaydSpec says how to run one gatewayd.
type gatewaydSpec struct {
	bin      string
	dataDir  string
	endpoint string // DynamoDB endpoint; a closed port for ingest runs
	prefix   string
	logPath  string
	env      []string // more GATEWAY_* settings
}

// gatewayd is one running gatewayd.
type gatewayd struct {
	spec     gatewaydSpec
	mqttAddr string
	httpAddr string
	// pprofAddr serves gatewayd's profiles (debug.pprof_addr).
	pprofAddr string
	proc      *proc.Process
	started   time.Time
	// ready is the time from the process start to the first /readyz 200.
	ready time.Duration
	http  *http.Client
}

// startGatewayd runs gatewayd on fresh loopback ports and waits for /readyz.
func startGatewayd(ctx context.Context, spec gatewaydSpec) (*gatewayd, error) {
	mqttAddr, err := proc.FreeAddr()
	if err != nil {
		return nil, err
	}
	httpAddr, err := proc.FreeAddr()
	for err == nil && httpAddr == mqttAddr {
		httpAddr, err = proc.FreeAddr()
	}
	if err != nil {
		return nil, err
	}
	pprofAddr, err := proc.FreeAddr()
	for err == nil && (pprofAddr == mqttAddr || pprofAddr == httpAddr) {
		pprofAddr, err = proc.FreeAddr()
	}
	if err != nil {
		return nil, err
	}
	g := &gatewayd{spec: spec, mqttAddr: mqttAddr, httpAddr: httpAddr, pprofAddr: pprofAddr,
		http: &http.Client{Timeout: 5 * time.Second}}
	logFile, err := os.OpenFile(spec.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.Command(spec.bin, "--data-dir", spec.dataDir, "--dynamodb-endpoint", spec.endpoint,
		"--table-prefix", spec.prefix, "--mqtt-addr", mqttAddr, "--http-addr", httpAddr, "--log-level", "warn", "--pprof-addr", pprofAddr)
	cmd.Env = gatewaydEnv(spec.env)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	g.started = time.Now()
	if g.proc, err = proc.Start("gatewayd", cmd); err != nil {
		return nil, err
	}
	poll := &http.Client{Timeout: time.Second}
	deadline := g.started.Add(readyTimeout)
	for {
		if g.proc.Exited() {
			return nil, fmt.Errorf("gatewayd exited during startup: %v\n%s", g.proc.Err(), tailFile(spec.logPath, 4096))
		}
		if resp, err := poll.Get("http://" + httpAddr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				g.ready = time.Since(g.started)
				return g, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			g.proc.Kill()
			return nil, fmt.Errorf("gatewayd not ready within %s\n%s", readyTimeout, tailFile(spec.logPath, 4096))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// gatewaydEnv is the benchmark's environment without any GATEWAY_ or AWS_
// setting that could change the gateway under test, plus extra.
func gatewaydEnv(extra []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GATEWAY_") && !strings.HasPrefix(kv, "AWS_") {
			env = append(env, kv)
		}
	}
	env = append(env, "GATEWAY_API_KEY_PEPPER="+pepper, "AWS_ACCESS_KEY_ID=local", "AWS_SECRET_ACCESS_KEY=local",
		"AWS_REGION="+awsRegion, "AWS_EC2_METADATA_DISABLED=true")
	return append(env, extra...)
}

func (g *gatewayd) pid() int { return g.proc.Pid() }

// stop stops gatewayd with SIGTERM (SIGKILL after 20 seconds).
func (g *gatewayd) stop() error {
	if err := g.proc.Stop(stopTimeout); err != nil {
		return fmt.Errorf("%w\n%s", err, tailFile(g.spec.logPath, 4096))
	}
	return nil
}

// metrics reads /metrics: every sample, keyed by the series as printed
// (name{labels}).
func (g *gatewayd) metrics(ctx context.Context) (samples, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.httpAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	// The drain reads /metrics ten times a second: gzipping each answer
	// (what Go's client asks for by default) would count as gatewayd's
	// work. Prometheus scrapes every 15 s or so.
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := g.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	out := samples{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// samples are Prometheus samples keyed by series.
type samples map[string]float64

// sum adds the samples of a metric whose labels contain every one of
// labels (`name="value"`).
func (s samples) sum(metric string, labels ...string) float64 {
	var total float64
	for series, v := range s {
		name, rest, _ := strings.Cut(series, "{")
		if name != metric {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(rest, l) {
				ok = false
				break
			}
		}
		if ok {
			total += v
		}
	}
	return total
}

// delta returns after - before for a metric (summed as sum does).
func delta(before, after samples, metric string, labels ...string) float64 {
	return after.sum(metric, labels...) - before.sum(metric, labels...)
}

// goMemory is the Go runtime's view of gatewayd's memory, from /metrics.
type goMemory struct {
	HeapAlloc  float64 `json:"heap_alloc_bytes"`
	HeapInuse  float64 `json:"heap_inuse_bytes"`
	StackInuse float64 `json:"stack_inuse_bytes"`
	NextGC     float64 `json:"next_gc_bytes"`
	Sys        float64 `json:"sys_bytes"`
	Goroutines float64 `json:"goroutines"`
}

func (g *gatewayd) goMemory(ctx context.Context) (goMemory, error) {
	m, err := g.metrics(ctx)
	if err != nil {
		return goMemory{}, err
	}
	return goMemory{
		HeapAlloc: m.sum("go_memstats_heap_alloc_bytes"), HeapInuse: m.sum("go_memstats_heap_inuse_bytes"),
		StackInuse: m.sum("go_memstats_stack_inuse_bytes"), NextGC: m.sum("go_memstats_next_gc_bytes"),
		Sys: m.sum("go_memstats_sys_bytes"), Goroutines: m.sum("go_goroutines"),
	}, nil
}

// saveHeapProfile writes gatewayd's heap profile (in-use and allocated
// space, after a GC) to path: go tool pprof -sample_index=inuse_space.
func (g *gatewayd) saveHeapProfile(ctx context.Context, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.pprofAddr+"/debug/pprof/heap?gc=1", nil)
	if err != nil {
		return err
	}
	resp, err := g.http.Do(req)
	if err != nil {
		return fmt.Errorf("reading the heap profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("reading the heap profile: %s", resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}

// quantileBound returns the upper bound of the histogram bucket holding the
// q quantile of what metric (a histogram, its series restricted to labels)
// observed between before and after; +Inf when it is in the last bucket, 0
// without observations.
func quantileBound(before, after samples, metric string, q float64, labels ...string) float64 {
	type bucket struct{ le, count float64 }
	var buckets []bucket
	for series := range after {
		name, rest, _ := strings.Cut(series, "{")
		if name != metric+"_bucket" {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(rest, l)
		}
		_, le, found := strings.Cut(rest, `le="`)
		if !ok || !found {
			continue
		}
		le, _, _ = strings.Cut(le, `"`)
		bound, err := strconv.ParseFloat(le, 64)
		if err != nil {
			continue
		}
		buckets = append(buckets, bucket{bound, after[series] - before[series]})
	}
	sort.Slice(buckets, func(i, j int) bool { return buckets[i].le < buckets[j].le })
	if len(buckets) == 0 || buckets[len(buckets)-1].count == 0 {
		return 0
	}
	want := q * buckets[len(buckets)-1].count // buckets are cumulative
	for _, b := range buckets {
		if b.count >= want {
			return b.le
		}
	}
	return math.Inf(1)
}
