package registry_test

import (
	"encoding/json"
	"errors"
	"testing"

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

func (s *countingStore) SaveStates(map[string][]byte) error { s.calls++; return nil }

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
