package buffer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/dgraph-io/badger/v4"
)

// LoadState returns a small state record saved with SaveState, or nil.
func (b *Buffer) LoadState(name string) ([]byte, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return nil, ErrClosed
	}
	var out []byte
	err := b.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(stateKey(name))
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		out, err = item.ValueCopy(nil)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("loading state %s: %w", name, err)
	}
	return out, nil
}

// LoadStates returns every state record whose name starts with prefix,
// by name.
func (b *Buffer) LoadStates(prefix string) (map[string][]byte, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return nil, ErrClosed
	}
	out := map[string][]byte{}
	err := b.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: stateKey(prefix), PrefetchValues: true})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			out[string(it.Item().Key()[len(statePrefix):])] = v
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("loading states %s*: %w", prefix, err)
	}
	return out, nil
}

// SaveState durably stores a small state record under name. State records
// count towards the budget but are never evicted.
func (b *Buffer) SaveState(name string, value []byte) error {
	return b.SaveStates(map[string][]byte{name: value})
}

// SaveStates durably stores several state records. They go through the
// committer like batches (queue_commit.go): written in the transaction of
// the next group commit, synced with it, and SaveStates returns once that
// group is on disk. Each record is written whole; records that do not fit
// in one Badger transaction (thousands of device records after a busy
// flush interval) are saved in as many synced transactions as they need,
// so on an error some may already be saved.
func (b *Buffer) SaveStates(records map[string][]byte) error {
	wait, err := b.SubmitStates(records)
	if err != nil {
		return err
	}
	return wait()
}

// SubmitStates queues state records for the next group commit, as
// SaveStates does, and returns at once with the wait for them to be on
// disk. Saves are written in the order they were submitted, so a caller
// that takes its snapshot and submits it under its own lock, then waits
// outside it, never has an older snapshot written over a newer one.
func (b *Buffer) SubmitStates(records map[string][]byte) (wait func() error, err error) {
	if len(records) == 0 {
		return func() error { return nil }, nil
	}
	req := &commitReq{states: records, done: make(chan error, 1)}
	if err := b.enqueue(context.Background(), req); err != nil {
		if errors.Is(err, ErrClosed) {
			return nil, err
		}
		return nil, fmt.Errorf("saving %d state records: %w", len(records), err)
	}
	return func() error {
		if err := <-req.done; err != nil {
			return fmt.Errorf("saving %d state records: %w", len(records), err)
		}
		return nil
	}, nil
}

// stateWrites is what a group's state records change in the counters.
type stateWrites struct {
	records int   // records written
	added   int64 // records that did not exist before
	bytes   int64 // the change in their size (recordSize)
}

// writeStates writes the state records of the group's requests through w,
// in the order of the requests (a later save of a name wins).
func writeStates(w *txnWriter, group []*commitReq) (stateWrites, error) {
	var sw stateWrites
	// written is the size of each record this group wrote: a transaction's
	// own writes do not tell their size.
	written := map[string]int64{}
	for _, req := range group {
		names := slices.Sorted(maps.Keys(req.states))
		for _, name := range names {
			k := stateKey(name)
			value := req.states[name]
			old, seen := written[name]
			if !seen {
				var err error
				if old, err = w.recordSize(k); err != nil {
					w.discard()
					return sw, fmt.Errorf("reading state %s: %w", name, err)
				}
			}
			if err := w.set(k, value); err != nil {
				return sw, err
			}
			if old == 0 {
				sw.added++
			}
			written[name] = recordSize(len(k), len(value))
			sw.bytes += written[name] - old
			sw.records++
		}
	}
	return sw, nil
}
