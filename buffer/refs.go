package buffer

import (
	"fmt"

	"github.com/dgraph-io/badger/v4"
)

// PendingRefs returns the sequence number, batch_id, hardware_id and
// receive time of up to limit queued batches with a sequence number greater
// than after, oldest first, without their payloads.
func (b *Buffer) PendingRefs(after uint64, limit int) ([]Pending, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return nil, ErrClosed
	}
	var out []Pending
	err := b.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: queuePrefix, PrefetchValues: true, PrefetchSize: min(limit, 100)})
		defer it.Close()
		from, atFloor := b.floor.from(after)
		for it.Seek(queueKey(from)); it.Valid() && len(out) < limit; it.Next() {
			item := it.Item()
			seq, ok := parseQueueKey(item.Key())
			if !ok {
				return fmt.Errorf("malformed queue key %q", item.Key())
			}
			if atFloor && len(out) == 0 {
				b.floor.raise(seq)
			}
			if err := item.Value(func(v []byte) error {
				p, err := decodePendingHeader(seq, v)
				if err != nil {
					return fmt.Errorf("queue entry %d: %w", seq, err)
				}
				out = append(out, p)
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading pending batch references: %w", err)
	}
	return out, nil
}
