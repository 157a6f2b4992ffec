package buffer

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/dgraph-io/ristretto/v2/z"
)

// BenchmarkTableFile writes an 8 MiB table file the two ways the vendored
// Badger has: allocated with fallocate, copied into a new writable mapping
// and msynced (table.CreateTable before its sixth change,
// third_party/README.md), or written with write(2) in 1 MiB writes and
// fsynced, then mapped (table.CreateTable now). Either way every page of
// the mapping is then read once, as a table's reads would fault them in.
// It reports the process's CPU time per file beside the wall time.
func BenchmarkTableFile(b *testing.B) {
	data := make([]byte, 8<<20)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	var pageSum byte
	for off := 0; off < len(data); off += 4096 {
		pageSum += data[off]
	}
	ways := []struct {
		name  string
		write func(name string) (*z.MmapFile, error)
	}{
		{"mapped", func(name string) (*z.MmapFile, error) {
			mf, err := z.OpenMmapFile(name, os.O_CREATE|os.O_RDWR|os.O_EXCL, len(data))
			if err != z.NewFile {
				return nil, err
			}
			copy(mf.Data, data)
			return mf, z.Msync(mf.Data)
		}},
		{"written", func(name string) (*z.MmapFile, error) {
			fd, err := os.OpenFile(name, os.O_CREATE|os.O_RDWR|os.O_EXCL, 0o666)
			if err != nil {
				return nil, err
			}
			for p := data; len(p) > 0; p = p[min(len(p), 1<<20):] {
				if _, err := fd.Write(p[:min(len(p), 1<<20)]); err != nil {
					return nil, err
				}
			}
			if err := fd.Sync(); err != nil {
				return nil, err
			}
			return z.OpenMmapFileUsing(fd, 0, true)
		}},
	}
	for _, w := range ways {
		b.Run(w.name, func(b *testing.B) {
			dir := b.TempDir()
			cpu0 := processCPU(b)
			b.SetBytes(int64(len(data)))
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				name := filepath.Join(dir, "table.sst")
				mf, err := w.write(name)
				if err != nil {
					b.Fatal(err)
				}
				var sum byte
				for off := 0; off < len(mf.Data); off += 4096 {
					sum += mf.Data[off]
				}
				if sum != pageSum {
					b.Fatalf("read %d, wrote %d", sum, pageSum)
				}
				if err := mf.Delete(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
		})
	}
}

// processCPU is the CPU time, user and system, the process has used.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
