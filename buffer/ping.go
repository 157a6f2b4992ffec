package buffer

import (
	"context"
	"errors"
	"fmt"
)

// Ping sends an empty request through the committer and waits for its
// answer: it fails when the committer is stuck (a disk that hangs) or the
// buffer is closed. A full buffer still answers.
func (b *Buffer) Ping(ctx context.Context) error {
	req := &commitReq{done: make(chan error, 1)}
	if err := b.enqueue(ctx, req); errors.Is(err, ErrClosed) {
		return err
	} else if err != nil {
		return fmt.Errorf("buffer: committer not taking requests: %w", err)
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("buffer: committer did not answer: %w", ctx.Err())
	}
}
