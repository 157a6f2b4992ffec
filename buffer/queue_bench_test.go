package buffer

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	"github.com/stretchr/testify/require"

	contract "greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/fleetgen"
)

// BenchmarkCommitConcurrency measures group commit against a baseline of
// one synced Badger transaction per commit, in the same run, for 1, 16 and
// 256 concurrent committers, each committing one 600-byte batch at a time
// (a device waiting for its ack). It reports commits/s and syncs/commit:
// synced Badger transactions (one msync of the write-ahead log each, plus
// one of the value log per Badger write batch) and directory fsyncs, per
// commit. The ratios are printed, not asserted.
func BenchmarkCommitConcurrency(b *testing.B) {
	type result struct{ perSec, syncs float64 }
	results := map[string]result{}
	var mu sync.Mutex
	for _, n := range []int{1, 16, 256} {
		b.Run(fmt.Sprintf("committers=%d/group_commit", n), func(b *testing.B) {
			buf := open(b, b.TempDir(), Options{})
			payload := string(make([]byte, 600))
			start := buf.syncs.Load()
			perSec := runCommitters(b, n, func(i int64) error {
				_, err := buf.Commit(context.Background(), []Entry{entry(fmt.Sprintf("id-%d", i), payload)})
				return err
			})
			syncs := float64(buf.syncs.Load()-start) / float64(b.N)
			b.ReportMetric(perSec, "commits/s")
			b.ReportMetric(syncs, "syncs/commit")
			mu.Lock()
			results[fmt.Sprintf("%d/group", n)] = result{perSec, syncs}
			mu.Unlock()
		})
		b.Run(fmt.Sprintf("committers=%d/one_sync_each", n), func(b *testing.B) {
			// The same records, the same Badger options, but every commit
			// its own synced transaction: no group commit.
			opts := DefaultOptions()
			db, err := badger.Open(badgerOptions(b.TempDir(), opts, badgerLogger{l: discardLogger()}))
			require.NoError(b, err)
			b.Cleanup(func() { _ = db.Close() })
			payload := make([]byte, 600)
			var seq atomic.Uint64
			perSec := runCommitters(b, n, func(i int64) error {
				id := fmt.Sprintf("id-%d", i)
				return db.Update(func(txn *badger.Txn) error {
					s := seq.Add(1)
					mk := marker{state: statePending, seq: s, receivedAt: time.Now()}
					if err := txn.Set(markerKey(id), mk.encode()); err != nil {
						return err
					}
					return txn.Set(queueKey(s), encodePending(Pending{BatchID: id, HardwareID: "AA:BB:CC:DD:EE:FF",
						ReceivedAt: time.Now(), Payload: payload}))
				})
			})
			b.ReportMetric(perSec, "commits/s")
			b.ReportMetric(1, "syncs/commit")
			mu.Lock()
			results[fmt.Sprintf("%d/single", n)] = result{perSec, 1}
			mu.Unlock()
		})
	}
	var keys []int
	for _, n := range []int{1, 16, 256} {
		if _, ok := results[fmt.Sprintf("%d/group", n)]; ok {
			keys = append(keys, n)
		}
	}
	sort.Ints(keys)
	for _, n := range keys {
		g, s := results[fmt.Sprintf("%d/group", n)], results[fmt.Sprintf("%d/single", n)]
		if s.perSec == 0 {
			continue
		}
		// Printed, not logged: a parent benchmark's log shows only with -v.
		fmt.Printf("committers=%-3d group commit %8.0f commits/s %.3f syncs/commit | one sync each %8.0f commits/s "+
			"1 sync/commit | group/one: throughput x%.1f, syncs x%.3f\n",
			n, g.perSec, g.syncs, s.perSec, g.perSec/s.perSec, g.syncs/s.syncs)
	}
}

// runCommitters runs b.N commits from n goroutines and returns commits/s.
func runCommitters(b *testing.B, n int, commit func(i int64) error) float64 {
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := commit(i); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	return float64(b.N) / elapsed.Seconds()
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// BenchmarkCommitGroupWait measures the adaptive group wait
// (Options.GroupMaxWait) against no wait, in the same run: n committers,
// each committing one 600-byte batch at a time, for several maximum waits.
// It reports commits/s, syncs/commit and the p50 and p99 time of one
// Commit. Printed, not asserted:
//
//	go test -run '^$' -bench CommitGroupWait -benchtime 3000x ./buffer
func BenchmarkCommitGroupWait(b *testing.B) {
	for _, n := range []int{1, 16, 256} {
		for _, wait := range []time.Duration{0, 250 * time.Microsecond, time.Millisecond, 4 * time.Millisecond} {
			b.Run(fmt.Sprintf("committers=%d/max_wait=%s", n, wait), func(b *testing.B) {
				buf := open(b, b.TempDir(), Options{GroupMaxWait: wait})
				payload := string(make([]byte, 600))
				start := buf.syncs.Load()
				lat := make([]time.Duration, b.N+1)
				perSec := runCommitters(b, n, func(i int64) error {
					begin := time.Now()
					_, err := buf.Commit(context.Background(), []Entry{entry(fmt.Sprintf("id-%d", i), payload)})
					lat[i] = time.Since(begin)
					return err
				})
				lat = lat[1:]
				slices.Sort(lat)
				b.ReportMetric(perSec, "commits/s")
				b.ReportMetric(float64(buf.syncs.Load()-start)/float64(b.N), "syncs/commit")
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			})
		}
	}
}

// footprintReadings is the readings per batch of BenchmarkIngestFootprint.
var footprintReadings = flag.Int("footprint-readings", 10, "BenchmarkIngestFootprint: readings per batch")

// realisticBatch is batch i of a greenhouse device as JSON, with n
// readings of four drifting sensor values: Badger compresses its blocks,
// so how much memory a table builder takes depends on how well the data
// compresses, and zeros would compress about a hundred times better than
// readings do.
func realisticBatch(i, n int) []byte {
	rng := rand.New(rand.NewPCG(uint64(i), 7))
	hw := fmt.Sprintf("02:BE:00:%02X:%02X:%02X", byte(i>>16), byte(i>>8), byte(i))
	start := int64(1_700_000_000_000) + int64(i)*int64(n)*1000
	out := fmt.Appendf(nil, `{"batch_id":"%s_%08x_%d_%d","hardware_id":"%s","boot_id":"%08x-5b1c-4f7e-9a2d-%012x","firmware_version":"1.0.16","seq":%d,"readings":[`,
		hw, rng.Uint32(), start, start+int64(n-1)*1000, hw, rng.Uint32(), rng.Uint64()&0xffffffffffff, i)
	temp := 20 + 5*rng.Float64()
	for r := range n {
		if r > 0 {
			out = append(out, ',')
		}
		temp += 0.1 * rng.NormFloat64()
		out = fmt.Appendf(out, `{"timestamp_ms":%d,"uptime_ms":%d,"sensors":{"bme280_temp_c":%.2f,"humidity_pct":%.1f,"pressure_hpa":%.2f,"soil_moisture_pct":%.1f},"sensor_status":{"bme280":"ok","soil_moisture":"ok"}}`,
			start+int64(r)*1000, 3_600_000+int64(r)*1000, temp, 95-1.8*temp+rng.NormFloat64(), 1013+2*rng.NormFloat64(), 50+10*rng.Float64())
	}
	return fmt.Appendf(out, `],"sent_uptime_ms":%d}`, 3_600_000+int64(n)*1000)
}

// footprintHeap is where BenchmarkIngestFootprint writes each variant's
// heap profile, taken after the run's GC with the buffer open.
var footprintHeap = flag.String("footprint-heap", "", "BenchmarkIngestFootprint: directory for heap profiles")

// BenchmarkIngestFootprint measures the memory Badger takes under
// sustained ingest with the buffer's options against alternatives, in
// the same run: 256 committers (devices waiting for their ack) commit b.N
// batches of ten readings as devices send them (realisticBatch). It reports
// commits/s, the largest heap in use seen during the run (sampled every
// 20 ms), the heap in use after a GC with the buffer still open, and the
// process's resident set then (which includes Badger's mapped files).
// Printed, not asserted:
//
//	go test -run '^$' -bench IngestFootprint -benchtime 100000x ./buffer
func BenchmarkIngestFootprint(b *testing.B) {
	b.Logf("batches of %d readings, %d bytes (-footprint-readings)", *footprintReadings, len(realisticBatch(0, *footprintReadings)))
	variants := []struct {
		name     string
		memtable int64
		tune     func(*badger.Options)
	}{
		{"memtable=16MiB/memtables=3", 16 << 20, func(o *badger.Options) { o.NumMemtables = 3 }},
		{"memtable=16MiB/memtables=2", 16 << 20, nil},
		{"memtable=8MiB/memtables=2", 8 << 20, nil},
		{"memtable=8MiB/memtables=2/index_cache=4MiB", 8 << 20, func(o *badger.Options) { o.IndexCacheSize = 4 << 20 }},
		{"memtable=8MiB/memtables=2/no_compression", 8 << 20, func(o *badger.Options) { o.Compression = options.None }},
		{"memtable=8MiB/memtables=2/value_log_above=512B", 8 << 20, func(o *badger.Options) { o.ValueThreshold = 512 }},
		{"memtable=2MiB/memtables=2/value_log_above=256B/vlog_files=16MiB/l0=2", 2 << 20, func(o *badger.Options) {
			o.ValueThreshold, o.ValueLogFileSize, o.NumLevelZeroTables = 256, 16<<20, 2
		}},
		{"memtable=8MiB/memtables=2/block=16KiB", 8 << 20, func(o *badger.Options) { o.BlockSize = 16 << 10 }},
		{"memtable=4MiB/memtables=2/block=16KiB", 4 << 20, func(o *badger.Options) { o.BlockSize = 16 << 10 }},
		{"memtable=4MiB/memtables=2/block=4KiB", 4 << 20, func(o *badger.Options) { o.BlockSize = 4 << 10 }},
		{"memtable=2MiB/memtables=2/block=16KiB", 2 << 20, func(o *badger.Options) { o.BlockSize = 16 << 10 }},
		{"memtable=4MiB/memtables=3/block=16KiB", 4 << 20, func(o *badger.Options) { o.BlockSize = 16 << 10; o.NumMemtables = 3 }},
		{"memtable=8MiB/memtables=3/block=16KiB", 8 << 20, func(o *badger.Options) { o.BlockSize = 16 << 10; o.NumMemtables = 3 }},
		{"memtable=8MiB/memtables=2/tables=512KiB", 8 << 20, func(o *badger.Options) { o.BaseTableSize = 512 << 10; o.BaseLevelSize = 5 * o.BaseTableSize }},
		{"memtable=8MiB/memtables=2/zstd", 8 << 20, func(o *badger.Options) { o.Compression = options.ZSTD }},
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			runtime.GC()
			debug.FreeOSMemory()
			opts := Options{MemTableSize: v.memtable, tuneBadger: v.tune}
			buf := open(b, b.TempDir(), opts)
			payloads := make([]string, 1024)
			for i := range payloads {
				payloads[i] = string(realisticBatch(i, *footprintReadings))
			}
			var peak atomic.Uint64
			stop := make(chan struct{})
			sampled := make(chan struct{})
			go func() {
				defer close(sampled)
				t := time.NewTicker(20 * time.Millisecond)
				defer t.Stop()
				var ms runtime.MemStats
				for {
					select {
					case <-stop:
						return
					case <-t.C:
						runtime.ReadMemStats(&ms)
						if ms.HeapInuse > peak.Load() {
							peak.Store(ms.HeapInuse)
						}
					}
				}
			}()
			perSec := runCommitters(b, 256, func(i int64) error {
				_, err := buf.Commit(context.Background(), []Entry{entry(fmt.Sprintf("AA:BB:CC:DD:EE:FF-%09d", i), payloads[i%int64(len(payloads))])})
				return err
			})
			close(stop)
			<-sampled
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if *footprintHeap != "" {
				f, err := os.Create(filepath.Join(*footprintHeap, "heap-"+strings.NewReplacer("/", "_", "=", "-").Replace(v.name)+".pb.gz"))
				require.NoError(b, err)
				require.NoError(b, pprof.WriteHeapProfile(f))
				require.NoError(b, f.Close())
			}
			b.ReportMetric(perSec, "commits/s")
			b.ReportMetric(float64(peak.Load())/(1<<20), "peak-heap-MB")
			b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-after-gc-MB")
			b.ReportMetric(float64(selfRSS())/(1<<20), "rss-MB")
		})
	}
}

// selfRSS is this process's resident set in bytes (VmRSS), 0 if unknown.
func selfRSS() int64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) == 2 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// fleetBatch is d's next batch of ten readings as the gateway stores it
// (its canonical encoding, about 2.3 KB), and its first and last reading
// times.
func fleetBatch(tb testing.TB, d *fleetgen.Device) (Entry, [2]int64) {
	tb.Helper()
	_, payload, err := d.Next(10)
	require.NoError(tb, err)
	now := time.Now()
	b, err := contract.DecodeBatch(payload, d.HardwareID(), contract.DefaultLimits(), now)
	require.NoError(tb, err)
	e := Entry{BatchID: b.BatchID, HardwareID: b.HardwareID, Hash: b.IdentityHash(), Payload: b.Canonical(), ReceivedAt: now}
	return e, [2]int64{b.Readings[0].TimestampMS, b.Readings[len(b.Readings)-1].TimestampMS}
}

// BenchmarkDrainBookkeeping measures the buffer's side of a drain at
// several block cache sizes: a backlog of 10,000 batches of ten readings
// from 1,000 devices, committed and reopened (so that it is read from
// tables, as after a restart, and its every record read once at the
// start, as Open does), leased 1,024 batches at a time and marked
// delivered 100 at a time with their reading times known, as the uplink
// does. It reports the time and the bytes allocated per batch, and the
// block cache's hit ratio: every miss decompresses a 16 KiB block into a
// new allocation.
func BenchmarkDrainBookkeeping(b *testing.B) {
	const devices, perDevice, lease, group = 1000, 10, 1024, 100
	for _, cache := range []int64{8 << 20, 16 << 20, 32 << 20, 64 << 20} {
		b.Run(fmt.Sprintf("block_cache=%dMiB", cache>>20), func(b *testing.B) {
			var batches, allocated int64
			var hits, misses uint64
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				dir := b.TempDir()
				opts := Options{BlockCacheSize: cache}
				buf := open(b, dir, opts)
				// The uplink learns a batch's reading times from the
				// payload it decodes anyway: here they are known
				// beforehand, so that the time measured is the buffer's.
				spans := map[string][2]int64{}
				devs := make([]*fleetgen.Device, devices)
				for d := range devs {
					devs[d] = fleetgen.NewDevice(fleetgen.HardwareID(0, d), time.Now().Add(-time.Hour), uint64(d))
				}
				for range perDevice {
					var entries []Entry
					for _, d := range devs {
						e, span := fleetBatch(b, d)
						spans[e.BatchID] = span
						entries = append(entries, e)
					}
					commit(b, buf, entries...)
				}
				require.NoError(b, buf.Close())
				buf = open(b, dir, opts)
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				before := ms.TotalAlloc
				m := buf.db.BlockCacheMetrics()
				hits0, misses0 := m.Hits(), m.Misses()
				b.StartTimer()
				var after uint64
				for {
					pend, err := buf.Pending(after, lease)
					require.NoError(b, err)
					if len(pend) == 0 {
						break
					}
					for k := range pend {
						span := spans[pend[k].BatchID]
						pend[k].FirstMS, pend[k].LastMS, pend[k].SpanKnown = span[0], span[1], true
					}
					for start := 0; start < len(pend); start += group {
						require.NoError(b, buf.MarkDelivered(pend[start:min(start+group, len(pend))]))
					}
					after = pend[len(pend)-1].Seq
					batches += int64(len(pend))
				}
				b.StopTimer()
				runtime.ReadMemStats(&ms)
				allocated += int64(ms.TotalAlloc - before)
				hits, misses = hits+m.Hits()-hits0, misses+m.Misses()-misses0
				require.NoError(b, buf.Close())
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(batches), "µs/batch")
			b.ReportMetric(float64(allocated)/float64(batches), "B/batch")
			b.ReportMetric(float64(hits)/float64(max(1, hits+misses)), "cache-hit-ratio")
		})
	}
}
