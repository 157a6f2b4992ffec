//go:build linux

package bench

import (
	"context"
	"runtime"
	"testing"
	"time"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/fleetgen"
)

// BenchmarkBufferIngest commits b.N batches of ten readings from 1,000
// devices into a buffer, 250 to a commit, as gatewayd's ingest path builds
// them, and reports the heap still in use after a GC with the buffer open
// (retained-heap-MB). It is the in-process counterpart of the MQTT
// scenario's "RSS after the load", for profiling:
//
//	go test -run '^$' -bench BufferIngest -benchtime 60000x \
//	    -memprofile mem.out -cpuprofile cpu.out ./harness/bench
//	go tool pprof -top -sample_index=alloc_space mem.out
//
// The memory profile is written after the buffer is closed, so it shows
// where memory was allocated, not what stayed in use.
func BenchmarkBufferIngest(b *testing.B) {
	buf, err := buffer.Open(b.TempDir(), buffer.Options{}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer buf.Close()
	start := time.Now().Add(-48 * time.Hour)
	devs := make([]*fleetgen.Device, 1000)
	for i := range devs {
		devs[i] = fleetgen.NewDevice(fleetgen.HardwareID(0xB0, i), start, uint64(i))
	}
	lim := contract.DefaultLimits()
	entries := make([]buffer.Entry, 0, 250)
	b.ResetTimer()
	for i := range b.N {
		d := devs[i%len(devs)]
		_, payload, err := d.Next(10)
		if err != nil {
			b.Fatal(err)
		}
		now := time.Now()
		batch, err := contract.DecodeBatch(payload, d.HardwareID(), lim, now)
		if err != nil {
			b.Fatal(err)
		}
		entries = append(entries, buffer.Entry{BatchID: batch.BatchID, HardwareID: batch.HardwareID,
			Hash: batch.IdentityHash(), Payload: batch.Canonical(), ReceivedAt: now})
		if len(entries) == cap(entries) || i == b.N-1 {
			if _, err := buf.Commit(context.Background(), entries); err != nil {
				b.Fatal(err)
			}
			entries = entries[:0]
		}
	}
	b.StopTimer()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "retained-heap-MB")
}
