package ingest_test

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/gateway/ingest"
	"greenhouse-gateway/harness/gatewaytest"
	"greenhouse-gateway/internal/audit"
)

// storeAll stores every batch, in memory: the benchmark measures the
// ingest path, not the disk.
type storeAll struct{}

func (storeAll) Commit(_ context.Context, entries []buffer.Entry) ([]buffer.Outcome, error) {
	out := make([]buffer.Outcome, len(entries))
	for i := range out {
		out[i] = buffer.Stored
	}
	return out, nil
}

func (st storeAll) Submit(ctx context.Context, entries []buffer.Entry) (func() ([]buffer.Outcome, error), error) {
	return ingest.CommitFunc(st.Commit).Submit(ctx, entries)
}

// BenchmarkIngestAudit compares the ingest path with and without the audit
// trail, for batches that are stored (nothing to record) and rejected.
func BenchmarkIngestAudit(b *testing.B) {
	hw := "AA:BB:CC:DD:EE:01"
	valid := gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), 0, 10)
	invalid := []byte(strings.Replace(string(valid), "45.2", `"high"`, 1))
	for _, c := range []struct {
		name    string
		payload []byte
		audit   bool
	}{
		{"stored/audit_off", valid, false}, {"stored/audit_on", valid, true},
		{"rejected/audit_off", invalid, false}, {"rejected/audit_on", invalid, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			var trail *audit.Log
			if c.audit {
				l, err := audit.Open(b.TempDir(), audit.Config{}, nil, nil, nil)
				if err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- l.Run(ctx) }()
				defer func() { cancel(); <-done }()
				trail = l
			}
			in, err := ingest.New(ingest.Config{}, ingest.Deps{Store: storeAll{}, Audit: trail, Registerer: prometheus.NewRegistry()})
			if err != nil {
				b.Fatal(err)
			}
			payloads := [][]byte{c.payload}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := in.Readings(context.Background(), ingest.Sender{HardwareID: hw}, payloads); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
