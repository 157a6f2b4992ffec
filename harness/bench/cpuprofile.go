//go:build linux

package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"
)

// pprofCPU saves gatewayd's CPU profile (/debug/pprof/profile, Go's
// sampling profiler) over a load's measured window: go tool pprof -top.
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
	go func() { p.done <- p.save() }()
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

func (p *pprofCPU) save() error {
	secs := max(1, int(p.seconds/time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), p.seconds+20*time.Second)
	defer cancel()
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", p.g.pprofAddr, secs)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{}).Do(req) // the profile takes longer than g.http's timeout
	if err != nil {
		return fmt.Errorf("reading the CPU profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("reading the CPU profile: %s", resp.Status)
	}
	if err := os.MkdirAll(filepath.Dir(p.path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(p.path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return fmt.Errorf("writing %s: %w", p.path, err)
	}
	return f.Close()
}
