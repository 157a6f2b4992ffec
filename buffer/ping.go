package buffer

import (
	"context"
	"fmt"
)

// Ping sends an empty request through the committer and waits for its
// answer: it fails when the committer is stuck (a disk that hangs) or the
// buffer is closed. A full buffer still answers.
func (b *Buffer) Ping(ctx context.Context) error {
	req := &commitReq{done: make(chan error, 1)}
	b.mu.RLock()
	if b.closed {
		b.mu.RUnlock()
		return ErrClosed
	}
	select {
	case b.reqs <- req:
		b.mu.RUnlock()
	case <-ctx.Done():
		b.mu.RUnlock()
		return fmt.Errorf("buffer: committer not taking requests: %w", ctx.Err())
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("buffer: committer did not answer: %w", ctx.Err())
	}
}
