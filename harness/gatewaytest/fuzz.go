package gatewaytest

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/gateway/ingest"
	"greenhouse-gateway/harness/modroot"
)

// Vector is one entry of the device contract's test vectors' index
// (firmware-contract/testdata/vectors.json); fuzz targets seed their
// corpus with the payloads.
type Vector struct {
	File   string `json:"file"`
	Sender string `json:"sender"`
	NowMS  int64  `json:"now_ms"`
}

// FuzzVectors returns the payloads of firmware-contract/testdata/<dir>
// with their vectors.
func FuzzVectors(f *testing.F, dir string) (payloads [][]byte, vectors []Vector) {
	f.Helper()
	root, err := modroot.Find()
	require.NoError(f, err)
	vectorsDir := filepath.Join(root, "firmware-contract", "testdata")
	raw, err := os.ReadFile(filepath.Join(vectorsDir, "vectors.json"))
	require.NoError(f, err)
	var all []Vector
	require.NoError(f, json.Unmarshal(raw, &all))
	for _, v := range all {
		if !strings.HasPrefix(v.File, dir+"/") {
			continue
		}
		p, err := os.ReadFile(filepath.Join(vectorsDir, v.File))
		require.NoError(f, err)
		payloads = append(payloads, p)
		vectors = append(vectors, v)
	}
	require.NotEmpty(f, payloads)
	return payloads, vectors
}

// Store modes of MemStore.
const (
	StoreWorks int32 = iota
	StoreFails
	StoreFull
)

// MemStore is a Committer in memory that can be told to fail or to be
// full (Mode), to reach the 503 and 507 answers.
type MemStore struct {
	mu      sync.Mutex
	batches map[string][32]byte
	Mode    atomic.Int32 // StoreWorks, StoreFails, StoreFull
}

// NewMemStore returns an empty store that works.
func NewMemStore() *MemStore { return &MemStore{batches: map[string][32]byte{}} }

// Commit stores entries by batch_id, as the buffer decides them.
func (m *MemStore) Commit(_ context.Context, entries []buffer.Entry) ([]buffer.Outcome, error) {
	switch m.Mode.Load() {
	case StoreFails:
		return nil, errors.New("injected: input/output error")
	case StoreFull:
		out := make([]buffer.Outcome, len(entries))
		for i := range out {
			out[i] = buffer.Full
		}
		return out, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]buffer.Outcome, len(entries))
	for i, e := range entries {
		switch h, ok := m.batches[e.BatchID]; {
		case !ok:
			m.batches[e.BatchID] = e.Hash
			out[i] = buffer.Stored
		case h == e.Hash:
			out[i] = buffer.Duplicate
		default:
			out[i] = buffer.Conflict
		}
	}
	return out, nil
}

// Submit commits at once.
func (m *MemStore) Submit(ctx context.Context, entries []buffer.Entry) (func() ([]buffer.Outcome, error), error) {
	return ingest.CommitFunc(m.Commit).Submit(ctx, entries)
}
