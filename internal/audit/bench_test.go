package audit_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"greenhouse-gateway/internal/audit"
)

// BenchmarkRecord measures what a refusal costs the ingest path (Record)
// and whether the writer keeps up: records dropped because the queue was
// full are reported as dropped/op.
func BenchmarkRecord(b *testing.B) {
	reg := prometheus.NewRegistry()
	l, err := audit.Open(b.TempDir(), audit.Config{MaxBytes: 1 << 30, SegmentBytes: 64 << 20}, nil, nil, reg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	r := audit.Record{Time: time.Now(), Transport: audit.TransportMQTT, Kind: "readings",
		HardwareID: "AA:BB:CC:DD:EE:FF", BatchID: "AA:BB:CC:DD:EE:FF_0b0e7d2c-5c1e-4f0e-9d55-0a4d7c1e2f3a_1732240000000_1732240060000",
		Reason: audit.ReasonValidation, Field: "readings[0].sensors.humidity_pct", Message: "must be a finite number",
		RemoteAddr: "192.168.1.40:51234"}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		l.Record(r)
	}
	b.StopTimer()
	res, err := l.Query(context.Background(), audit.Filter{Limit: 1})
	if err != nil || len(res.Records) != 1 {
		b.Fatalf("query: %v %v", res, err)
	}
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "gateway_audit_dropped_records_total" {
			dropped := 0.0
			for _, m := range mf.GetMetric() {
				dropped += m.GetCounter().GetValue()
			}
			b.ReportMetric(dropped/float64(b.N), "dropped/op")
		}
	}
}
