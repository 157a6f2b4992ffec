package audit_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/audit"
)

// BenchmarkRecord measures what a refusal costs the ingest path (Record)
// and whether the writer keeps up: records dropped because the queue was
// full are reported as dropped/op. one_by_one writes every record
// (audit.max_records_per_second out of the way); aggregated has the
// defaults, so that a tight loop is almost entirely counted in aggregates.
func BenchmarkRecord(b *testing.B) {
	b.Run("one_by_one", func(b *testing.B) {
		benchmarkRecord(b, audit.Config{MaxBytes: 1 << 30, SegmentBytes: 64 << 20, MaxRecordsPerSecond: 1_000_000,
			BurstRecords: 1_000_000})
	})
	b.Run("aggregated", func(b *testing.B) { benchmarkRecord(b, audit.Config{}) })
}

func benchmarkRecord(b *testing.B, cfg audit.Config) {
	reg := prometheus.NewRegistry()
	l, err := audit.Open(b.TempDir(), cfg, nil, nil, reg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	r := audit.Record{Time: time.Now(), Transport: contract.TransportMQTT, Kind: "readings",
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

// BenchmarkQueryFullTrail queries a full trail of 64 MiB of records
// written one by one.
func BenchmarkQueryFullTrail(b *testing.B) {
	l, err := audit.Open(b.TempDir(), audit.Config{QueueRecords: 1 << 20, MaxBytes: 64 << 20, MaxRecordsPerSecond: 1_000_000,
		BurstRecords: 1_000_000}, nil, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	defer func() { cancel(); <-done }()
	start := time.Now().Add(-time.Hour)
	const n = 240_000 // about 70 MB of records: the cap deletes the oldest
	for i := range n {
		l.Record(audit.Record{Time: start.Add(time.Duration(i) * time.Millisecond), Transport: contract.TransportMQTT,
			Kind: "readings", HardwareID: fmt.Sprintf("AA:BB:CC:DD:%02X:%02X", i/256%256, i%256),
			BatchID: fmt.Sprintf("AA:BB:CC:DD:EE:FF_0b0e7d2c-5c1e-4f0e-9d55-0a4d7c1e2f3a_%d", i), Reason: audit.ReasonValidation,
			Field: "readings[0].sensors.humidity_pct", Message: "must be a finite number", RemoteAddr: "192.168.1.40:51234"})
	}
	// Wait for the writer (a query first writes everything queued).
	for try := 0; ; try++ {
		res, err := l.Query(context.Background(), audit.Filter{Limit: 1})
		if err != nil {
			b.Fatal(err)
		}
		if len(res.Records) == 1 && strings.HasSuffix(res.Records[0].BatchID, fmt.Sprintf("_%d", n-1)) {
			break
		}
		if try == 100 {
			b.Fatal("the writer did not catch up")
		}
	}
	for _, c := range []struct {
		name string
		f    audit.Filter
	}{
		{"newest_100", audit.Filter{Limit: 100}},
		{"one_device_whole_trail", audit.Filter{HardwareID: "AA:BB:CC:DD:00:01", Limit: 1000}},
		{"reason_matching_nothing", audit.Filter{Reason: audit.ReasonConflict, Limit: 1000}},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := l.Query(context.Background(), c.f); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
