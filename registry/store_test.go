package registry_test

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/registry"
)

// countingStore is a device store that counts its calls and fails loads.
type countingStore struct{ calls int }

func (s *countingStore) LoadState(string) ([]byte, error) { s.calls++; return nil, errLoad }

func (s *countingStore) SaveState(string, []byte) error { s.calls++; return nil }

func (s *countingStore) LoadStates(string) (map[string][]byte, error) {
	s.calls++
	return nil, errLoad
}

func (s *countingStore) SubmitStates(map[string][]byte) (func() error, error) {
	s.calls++
	return func() error { return nil }, nil
}

var errLoad = errors.New("load failed")

func TestNewReadsNothingAndLoadReadsTheSavedRecords(t *testing.T) {
	store := &countingStore{}
	reg, err := registry.New(registry.Config{}, store, nil, nil, nil)
	require.NoError(t, err)
	require.Zero(t, store.calls, "New touches the store")
	require.ErrorIs(t, reg.Load(), errLoad)

	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer buf.Close()
	hw := "AA:BB:CC:DD:EE:29"
	raw, err := json.Marshal(registry.Device{HardwareID: hw, Registered: true, ConfirmationID: "c-1"})
	require.NoError(t, err)
	require.NoError(t, buf.SaveState("dev/"+hw, raw))
	reg, err = registry.New(registry.Config{}, buf, nil, nil, nil)
	require.NoError(t, err)
	require.False(t, reg.Registered(hw))
	require.NoError(t, reg.Load())
	require.True(t, reg.Registered(hw))
	d, ok := reg.Device(hw)
	require.True(t, ok)
	require.Equal(t, "c-1", d.ConfirmationID)
}

// orderedStore applies saves in the order they reach it, as the buffer's
// committer does; the first submission (a Flush) reaches it late.
type orderedStore struct {
	mu      sync.Mutex
	applied map[string][]byte
	submits int
}

func (s *orderedStore) LoadState(string) ([]byte, error)             { return nil, nil }
func (s *orderedStore) LoadStates(string) (map[string][]byte, error) { return nil, nil }

func (s *orderedStore) SaveState(name string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.applied[name] = value
	return nil
}

func (s *orderedStore) SubmitStates(records map[string][]byte) (func() error, error) {
	s.mu.Lock()
	s.submits++
	first := s.submits == 1
	s.mu.Unlock()
	if first {
		time.Sleep(150 * time.Millisecond)
	}
	for name, value := range records {
		_ = s.SaveState(name, value)
	}
	return func() error { return nil }, nil
}

// TestAFlushNeverOverwritesANewerSave: a Flush's snapshot reaches the
// store before a clock anchor saved after it was taken, so the anchor,
// which must be on disk before its batch is acknowledged, stays there.
func TestAFlushNeverOverwritesANewerSave(t *testing.T) {
	store := &orderedStore{applied: map[string][]byte{}}
	reg, err := registry.New(registry.Config{}, store, nil, nil, nil)
	require.NoError(t, err)
	require.NoError(t, reg.Load())
	hw := "AA:BB:CC:00:00:31"
	reg.NotSynced(hw) // the device's record is dirty
	flushed := make(chan error, 1)
	go func() { flushed <- reg.Flush() }()
	time.Sleep(30 * time.Millisecond) // the Flush has taken its snapshot
	_, err = reg.Anchor(hw, "7c9e6679-7425-40de-944b-e07fc1f90ae7", 1_000_000, 500)
	require.NoError(t, err)
	require.NoError(t, <-flushed)

	store.mu.Lock()
	defer store.mu.Unlock()
	var saved registry.Device
	for name, raw := range store.applied {
		if strings.HasSuffix(name, hw) {
			require.NoError(t, json.Unmarshal(raw, &saved))
		}
	}
	require.Len(t, saved.Anchors, 1, "the anchor saved after the Flush's snapshot is what the disk holds")
}
