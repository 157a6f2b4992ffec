package buffer

import (
	"errors"
	"fmt"
)

// PendingRefs returns the sequence number, batch_id, hardware_id and
// receive time of up to limit queued batches with a sequence number greater
// than after, oldest first, without their payloads.
func (b *Buffer) PendingRefs(after uint64, limit int) ([]Pending, error) {
	out, err := b.readQueue(after, limit, decodePendingHeader)
	if err != nil && !errors.Is(err, ErrClosed) {
		return nil, fmt.Errorf("reading pending batch references: %w", err)
	}
	return out, err
}
