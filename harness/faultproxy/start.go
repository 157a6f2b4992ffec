package faultproxy

import (
	"context"
	"testing"
)

// Start serves a proxy to target on a loopback port, in Pass mode with
// seed for Mix, until tb's cleanup.
func Start(tb testing.TB, target string, seed uint64) *Proxy {
	tb.Helper()
	p, err := New(Config{Target: target, Seed: seed}, nil)
	if err != nil {
		tb.Fatal(err)
	}
	if err := p.Listen(); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("fault proxy: %v", err)
		}
	})
	return p
}
