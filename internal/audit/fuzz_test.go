package audit_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/internal/audit"
)

// FuzzReadSegment reads arbitrary bytes as a segment left on disk: a query
// never fails on them, and returns only whole records.
func FuzzReadSegment(f *testing.F) {
	f.Add([]byte(`{"time":"2026-11-20T10:00:00Z","transport":"mqtt","reason":"conflict","batch_id":"b"}` + "\n"))
	f.Add([]byte(`{"time":"2026-11-20T10:00:00Z","transport":"mq`))
	f.Add([]byte("\x00\x00\x00\n{}\n[]\nnull\n"))
	f.Add([]byte(`{"time":"not a time","reason":"x"}` + "\n" + `{"time":"2026-11-20T10:00:01Z","reason":"duplicate"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, "20261120-0000000001.ndjson"), data, 0o600))
		l, err := audit.Open(dir, audit.Config{}, nil, nil, nil)
		require.NoError(t, err)
		res, err := l.Query(context.Background(), audit.Filter{Limit: 1000})
		require.NoError(t, err)
		for _, r := range res.Records {
			require.False(t, r.Time.IsZero())
			require.NotEmpty(t, r.Reason)
		}
		require.NoError(t, l.Close())
	})
}
