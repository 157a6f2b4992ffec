package faultproxy

import (
	"context"
	"testing"
)

// Start serves a proxy to target on a loopback port, in Pass mode with
// seed for Mix, until tb's cleanup.
func Start(tb testing.TB, target string, seed uint64) *Proxy {
	tb.Helper()
	p, stop, err := Launch(Config{Target: target, Seed: seed})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := stop(); err != nil {
			tb.Errorf("fault proxy: %v", err)
		}
	})
	return p
}

// Launch serves a proxy with cfg, in Pass mode, until stop is called;
// stop returns what Run returned.
func Launch(cfg Config) (p *Proxy, stop func() error, err error) {
	if p, err = New(cfg, nil); err != nil {
		return nil, nil, err
	}
	if err := p.Listen(); err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	return p, func() error {
		cancel()
		return <-done
	}, nil
}
