package devicesim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"sync"

	"greenhouse-gateway/firmware-contract"
)

// keyStore holds the device keys the devices were issued, by hardware_id: the simulator's NVS.
// With a path, every key is written to a JSON file ({"AA:BB:CC:DD:EE:01":"<64 hex>",...})
// before put returns, atomically (temporary file, fsync, rename, directory fsync) and with mode
// 0600, so that keys survive a restart of the simulator; without one, keys live in memory.
// It is safe for concurrent use. Devices that enroll at the same time share one write of the
// file.
type keyStore struct {
	path string

	mu   sync.Mutex
	keys map[string]string
	gen  uint64 // changes made to keys

	writeMu sync.Mutex // one file write at a time
	written uint64     // the gen the file holds
}

// openKeyStore returns a store backed by the file at path, reading the keys it holds (none
// when it does not exist yet), or a store in memory when path is empty.
func openKeyStore(path string) (*keyStore, error) {
	s := &keyStore{path: path, keys: map[string]string{}}
	if path == "" {
		return s, nil
	}
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("devicesim: reading the key store: %w", err)
	}
	if err := json.Unmarshal(raw, &s.keys); err != nil {
		return nil, fmt.Errorf("devicesim: key store %s: want a JSON object of hardware_id to device key: %w", path, err)
	}
	if s.keys == nil { // the file said null
		s.keys = map[string]string{}
	}
	for hw, key := range s.keys {
		if err := contract.ValidHardwareID(hw); err != nil {
			return nil, fmt.Errorf("devicesim: key store %s: %w", path, err)
		}
		if !validDeviceKey(key) {
			return nil, fmt.Errorf("devicesim: key store %s: the key of %s must be 64 lower-case hexadecimal digits", path, hw)
		}
	}
	return s, nil
}

// get returns the device key stored for hw, if any.
func (s *keyStore) get(hw string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key, ok := s.keys[hw]
	return key, ok
}

// where names the store for a log line: its file, or "memory".
func (s *keyStore) where() string {
	if s.path == "" {
		return "memory"
	}
	return s.path
}

// len returns the number of keys held.
func (s *keyStore) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}

// put stores hw's key and, with a file, returns once the file holds it. On error the key is
// not kept, in memory either: a device must not use a key it could lose.
func (s *keyStore) put(hw, key string) error {
	s.mu.Lock()
	prev, had := s.keys[hw]
	s.keys[hw] = key
	s.gen++
	gen := s.gen
	s.mu.Unlock()
	if s.path == "" {
		return nil
	}
	err := s.flush(gen)
	if err != nil {
		s.mu.Lock()
		if s.keys[hw] == key {
			if had {
				s.keys[hw] = prev
			} else {
				delete(s.keys, hw)
			}
			s.gen++
		}
		s.mu.Unlock()
	}
	return err
}

// flush writes the file unless a write since gen was made already covers it.
func (s *keyStore) flush(gen uint64) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if s.written >= gen {
		return nil
	}
	s.mu.Lock()
	snapshot, upTo := maps.Clone(s.keys), s.gen
	s.mu.Unlock()
	raw, err := json.MarshalIndent(snapshot, "", "  ")
	if err != nil {
		return fmt.Errorf("devicesim: encoding the key store: %w", err)
	}
	if err := writeFileAtomic(s.path, append(raw, '\n')); err != nil {
		return fmt.Errorf("devicesim: writing the key store: %w", err)
	}
	s.written = upTo
	return nil
}

// writeFileAtomic replaces the file at path with data, mode 0600: a temporary file in the
// same directory, fsync, rename, fsync of the directory. A crash leaves the old file or the
// new one.
func writeFileAtomic(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(0o600)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// validDeviceKey reports whether key has the form of a raw API key: 64 lower-case
// hexadecimal digits.
func validDeviceKey(key string) bool {
	if len(key) != 64 {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
