package devicesim

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func testDeviceKey(n int) string { return fmt.Sprintf("%064x", n+1) }

func TestKeyStoreFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "keys.json")
	s, err := openKeyStore(path)
	require.NoError(t, err)
	require.Zero(t, s.len(), "a missing file is an empty store")
	_, err = os.Stat(path)
	require.True(t, os.IsNotExist(err), "opening writes nothing")

	// Devices enrolling at once: every key is in the file when its put returns.
	const n = 50
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			hw := fmt.Sprintf("02:00:00:00:00:%02X", i)
			if err := s.put(hw, testDeviceKey(i)); err != nil {
				t.Errorf("put %s: %v", hw, err)
				return
			}
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Errorf("reading the store: %v", err)
				return
			}
			var onDisk map[string]string
			if err := json.Unmarshal(raw, &onDisk); err != nil {
				t.Errorf("the store is not whole JSON: %v", err)
				return
			}
			if onDisk[hw] != testDeviceKey(i) {
				t.Errorf("%s: put returned before the file held its key", hw)
			}
		})
	}
	wg.Wait()

	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "the key store is a secret")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary file is left behind")

	// A restart reads every key back.
	again, err := openKeyStore(path)
	require.NoError(t, err)
	require.Equal(t, n, again.len())
	key, ok := again.get("02:00:00:00:00:07")
	require.True(t, ok)
	require.Equal(t, testDeviceKey(7), key)
	require.Equal(t, path, again.where())
}

func TestKeyStoreInMemory(t *testing.T) {
	s, err := openKeyStore("")
	require.NoError(t, err)
	require.NoError(t, s.put("02:00:00:00:00:01", testDeviceKey(1)))
	key, ok := s.get("02:00:00:00:00:01")
	require.True(t, ok)
	require.Equal(t, testDeviceKey(1), key)
	require.Equal(t, "memory", s.where())
}

func TestKeyStoreWriteFailureKeepsNothing(t *testing.T) {
	s, err := openKeyStore(filepath.Join(t.TempDir(), "missing-dir", "keys.json"))
	require.NoError(t, err)
	err = s.put("02:00:00:00:00:01", testDeviceKey(1))
	require.ErrorContains(t, err, "writing the key store")
	_, ok := s.get("02:00:00:00:00:01")
	require.False(t, ok, "a key that could not be stored is not kept")
}

func TestKeyStoreRejectsBadFiles(t *testing.T) {
	tests := []struct{ name, content, want string }{
		{"not JSON", "{", "want a JSON object of hardware_id to device key"},
		{"array", `["x"]`, "want a JSON object"},
		{"bad hardware_id", `{"02-00-00-00-00-01":"` + testDeviceKey(1) + `"}`, "hardware_id: must be a MAC address"},
		{"short key", `{"02:00:00:00:00:01":"abc"}`, "the key of 02:00:00:00:00:01 must be 64 lower-case hexadecimal digits"},
		{"upper-case key", `{"02:00:00:00:00:01":"` + strings.ToUpper(testDeviceKey(10)) + `"}`, "must be 64 lower-case"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "keys.json")
			require.NoError(t, os.WriteFile(path, []byte(tt.content), 0o600))
			_, err := openKeyStore(path)
			require.ErrorContains(t, err, tt.want)
			require.ErrorContains(t, err, path)
		})
	}
	s, err := openKeyStore(writeTemp(t, "null"))
	require.NoError(t, err, "null is an empty store")
	require.Zero(t, s.len())
}

func writeTemp(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keys.json")
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}
