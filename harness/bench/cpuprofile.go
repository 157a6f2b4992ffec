//go:build linux

package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// pprofCPU saves gatewayd's CPU profile (/debug/pprof/profile, Go's
// sampling profiler) over a load's measured window, and beside it what
// was allocated in the same window (/debug/pprof/allocs as a delta, the
// file name's "cpu-" prefix turned "alloc-"): go tool pprof -top, and
// -sample_index=alloc_space for the allocations.
type pprofCPU struct {
	g       *gatewayd
	seconds time.Duration
	path    string
	done    chan error
	err     error
}

func (p *pprofCPU) hooks() loadHooks { return loadHooks{start: p.start, end: p.end} }

// start begins the profile; it runs for p.seconds.
func (p *pprofCPU) start() {
	p.done = make(chan error, 1)
	go func() {
		allocs := make(chan error, 1)
		go func() { allocs <- p.save("allocs", allocPath(p.path)) }()
		p.done <- errors.Join(p.save("profile", p.path), <-allocs)
	}()
}

// allocPath is the allocation profile's path beside the CPU profile's.
func allocPath(cpu string) string {
	dir, name := filepath.Split(cpu)
	return filepath.Join(dir, "alloc-"+strings.TrimPrefix(name, "cpu-"))
}

// end waits for the profile to be saved and keeps its error in p.err.
func (p *pprofCPU) end() {
	if p.done == nil {
		return
	}
	select {
	case p.err = <-p.done:
	case <-time.After(p.seconds + 30*time.Second):
		p.err = fmt.Errorf("CPU profile %s: no answer from gatewayd", p.path)
	}
}

// save saves profile (a /debug/pprof/ name) over p.seconds at path.
func (p *pprofCPU) save(profile, path string) error {
	secs := max(1, int(p.seconds/time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), p.seconds+20*time.Second)
	defer cancel()
	url := fmt.Sprintf("http://%s/debug/pprof/%s?seconds=%d", p.g.pprofAddr, profile, secs)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{}).Do(req) // the profile takes longer than g.http's timeout
	if err != nil {
		return fmt.Errorf("reading the %s profile: %w", profile, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("reading the %s profile: %s", profile, resp.Status)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
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
