package buffer

import (
	"errors"
	"fmt"

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

// SaveStates durably stores several state records. Each record is written
// whole; records that do not fit in one Badger transaction (thousands of
// device records after a busy flush interval) are saved in as many synced
// transactions as they need, so on an error some may already be saved.
func (b *Buffer) SaveStates(records map[string][]byte) error {
	if len(records) == 0 {
		return nil
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return ErrClosed
	}
	b.wmu.Lock()
	defer b.wmu.Unlock()
	names := make([]string, 0, len(records))
	for name := range records {
		names = append(names, name)
	}
	for len(names) > 0 {
		n, err := b.saveStates(names, records)
		if err != nil {
			return fmt.Errorf("saving %d state records: %w", len(records), err)
		}
		names = names[n:]
	}
	return nil
}

// saveStates saves the records of as many of names as fit in one synced
// transaction and returns how many it saved.
func (b *Buffer) saveStates(names []string, records map[string][]byte) (int, error) {
	var delta, added int64
	b.vlogSyncFailed.Store(false)
	if err := b.failure.failed(); err != nil {
		return 0, err
	}
	txn := b.db.NewTransaction(true)
	defer txn.Discard()
	n := 0
	for _, name := range names {
		k := stateKey(name)
		value := records[name]
		var old int64
		item, err := txn.Get(k)
		switch {
		case err == nil:
			old = recordSize(len(k), int(item.ValueSize()))
		case errors.Is(err, badger.ErrKeyNotFound):
		default:
			return 0, err
		}
		if err := txn.Set(k, value); errors.Is(err, badger.ErrTxnTooBig) && n > 0 {
			break // the rest go in the next transaction
		} else if err != nil {
			return 0, err
		}
		if old == 0 {
			added++
		}
		delta += recordSize(len(k), len(value)) - old
		n++
	}
	err := txn.Commit()
	if err != nil {
		b.failure.fail(err)
	}
	if err == nil && b.vlogSyncFailed.Swap(false) {
		err = errors.New("badger could not sync its value log")
	}
	if err == nil {
		err = b.dirSync.syncIfChanged()
	}
	if err != nil {
		return 0, err
	}
	b.usage.state.Add(delta)
	b.usage.stateRecords.Add(added)
	return n, nil
}
