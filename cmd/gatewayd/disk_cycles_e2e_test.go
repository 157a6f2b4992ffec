package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/harness/faultfs"
	"greenhouse-gateway/internal/cloud"
)

// denseBatch is a batch of 4 readings of 24 random sensors: about 2.7 KiB
// that compress poorly, few readings for DynamoDB Local to write.
func denseBatch(hw, boot string, i int) []byte { return denseBatchOf(hw, boot, i, 4, 24) }

// denseBatchOf is denseBatch with n readings of m sensors (4 of 64: about
// 7 KiB), evenly spread over the batch's 5 s.
func denseBatchOf(hw, boot string, i, n, m int) []byte {
	// 5 s apart from a week ago: 120,000 batches before they would reach
	// the present (10 full-disk cycles send about 25,000).
	end := time.Now().Add(-7*24*time.Hour).UnixMilli() + int64(i)*5_000
	var readings []string
	for k := range n {
		var sensors []string
		for s := range m {
			sensors = append(sensors, fmt.Sprintf(`"sensor_%d":%.6f`, s, rand.Float64()*100))
		}
		readings = append(readings, fmt.Sprintf(`{"timestamp_ms":%d,"sensors":{%s}}`, end-int64(n-k)*(4_000/int64(n)), strings.Join(sensors, ",")))
	}
	return []byte(fmt.Sprintf(`{"batch_id":"%s_%s_%d_%d","hardware_id":"%s","boot_id":"%s","firmware_version":"1.0.16","seq":%d,"readings":[%s]}`,
		hw, boot, end-5_000, end, hw, boot, i, strings.Join(readings, ",")))
}

// batchShape is what one device posts in the full-disk cycles: requests
// of perRequest batches of readings readings of sensors sensors.
type batchShape struct{ perRequest, readings, sensors int }

// TestFullDiskCyclesWithFrozenUplink fills a tmpfs through gatewayd while
// DynamoDB Local is frozen (SIGSTOP), until devices are answered 507, then
// thaws it: the uplink drains, Badger flushes and compacts on the nearly
// full disk (its files are allocated before they are mapped, so a write
// through the map is never a SIGBUS), and ingest resumes once space is
// back. Each cycle asserts the process is alive, and a sampler every 25 ms
// that free space never fell under the watermark by more than a commit
// group and Badger's next files; at the end every acknowledged batch is in
// DynamoDB exactly once. Then gatewayd is restarted on a disk filled to the
// brim by another writer: it must start, answer 507, and accept again once
// space returns, without a restart.
func TestFullDiskCyclesWithFrozenUplink(t *testing.T) {
	if testing.Short() {
		t.Skip("runs gatewayd on a tmpfs")
	}
	t.Run("small batches", func(t *testing.T) {
		fullDiskCycles(t, 48<<20, buffer.RequiredFreeBytes(diskMemTable), batchShape{20, 4, 24})
	})
	// A 64 MiB card and batches of 64 sensors (about 7 KiB, 140 KiB a
	// commit group).
	t.Run("large batches", func(t *testing.T) {
		fullDiskCycles(t, 64<<20, buffer.RequiredFreeBytes(diskMemTable), batchShape{20, 4, 64})
	})
	// The largest batches the default limits let in (100 readings of 64
	// sensors, about 170 KiB of JSON), 5 a request: stored values over the
	// 1 MiB memtable's ValueThreshold (128 KiB), so they are in Badger's
	// value log, whose files the reclaim must collect.
	t.Run("largest batches", func(t *testing.T) {
		fullDiskCycles(t, 64<<20, buffer.RequiredFreeBytes(diskMemTable), batchShape{5, 100, 64})
	})
}

// fullDiskCycles is TestFullDiskCyclesWithFrozenUplink on a tmpfs of size
// bytes, with buffer.min_free_bytes watermark and batches of shape.
func fullDiskCycles(t *testing.T, size, watermark int64, shape batchShape) {
	mnt := mountTmpfs(t, size)
	local := dynamotest.Start(t)
	view := cloudView{client: local.Client(t), tables: local.NewTables(t)}
	key, _, err := cloud.NewKeys(view.client, view.tables.APIKeys, e2ePepper).Create(t.Context(), "disk")
	require.NoError(t, err)
	prefix := strings.TrimSuffix(view.tables.Devices, "devices")
	dataDir := filepath.Join(mnt, "data")
	env := []string{fmt.Sprintf("GATEWAY_BUFFER_MEMTABLE_SIZE=%d", diskMemTable),
		fmt.Sprintf("GATEWAY_BUFFER_MIN_FREE_BYTES=%d", watermark), "GATEWAY_BUFFER_HISTORY_RETENTION=-1s",
		// One device stands in for a greenhouse filling the disk: no
		// per-device rate (its 10 cycles send more than the burst).
		"GATEWAY_BUFFER_DEVICE_BATCH_RATE=-1"}
	d := startPlainDaemon(t, dataDir, local.Endpoint, prefix, env...)
	hw := "02:00:00:00:D1:5C"
	boot := uuid.NewString()
	acked := map[string]int{} // batch_id → readings
	next := 0
	push := func() int {
		var batches [][]byte
		for range shape.perRequest {
			batches = append(batches, denseBatchOf(hw, boot, next, shape.readings, shape.sensors))
			next++
		}
		code, _, results := postBatches(t, d, key, batches)
		require.Len(t, results, len(batches), "every batch answered")
		for _, r := range results {
			// Accepted, or told to wait: never a validation_error.
			if r.Status == contract.StatusAccepted {
				acked[r.BatchID] = shape.readings
			} else {
				require.NotNil(t, r.Reason, "batch %s: %s without a reason", r.BatchID, r.Status)
				require.Equal(t, contract.ReasonBufferFull, *r.Reason, "batch %s", r.BatchID)
			}
		}
		return code
	}
	// The key is verified and cached while DynamoDB answers.
	require.Equal(t, http.StatusOK, push())

	// Under the watermark by at most one commit group (a request) and
	// what Badger allocates after the last admitted batch, which the
	// watermark is there for: a new write-ahead log (twice the memtable),
	// a flushed table and the table a compaction is writing. A compaction
	// takes one table and the at most ten it overlaps (third_party badger
	// 0009), not every queue table a table spanning the markers and the
	// queue overlaps.
	group := int64(len(denseBatchOf(hw, boot, 0, shape.readings, shape.sensors)) * shape.perRequest)
	floor := watermark - group - 4*diskMemTable
	low := sampleFreeSpace(t, mnt, dataDir)
	for cycle := range attackSize(1, 10) {
		local.Pause(t)
		full := false
		for range 2000 {
			code := push()
			low.sample()
			requireAlive(t, d)
			if code == http.StatusInsufficientStorage {
				full = true
				break
			}
			require.Contains(t, []int{http.StatusOK, http.StatusMultiStatus}, code)
		}
		require.True(t, full, "cycle %d: no 507; free %d bytes", cycle, freeBytes(t, mnt))
		filled := freeBytes(t, mnt)
		local.Resume(t)
		// Drain: ingest resumes once the uplink's deletions are compacted away.
		start := time.Now()
		require.Eventually(t, func() bool {
			low.sample()
			requireAlive(t, d)
			return d.metric(t, "gateway_buffer_pending_batches") == "0"
		}, 180*time.Second, 200*time.Millisecond, "cycle %d: the backlog drains", cycle)
		drained := time.Since(start)
		start = time.Now()
		require.Eventually(t, func() bool {
			low.sample()
			return push() == http.StatusOK
		}, 60*time.Second, 500*time.Millisecond, "cycle %d: ingest resumes; free %.1f MiB, the data directory: %s",
			cycle, mib(freeBytes(t, mnt)), listData(dataDir))
		lowest := low.take()
		t.Logf("cycle %d: 507 with %.1f MiB free (watermark %.1f MiB); drained in %s; accepting again %s later; "+
			"lowest free %.1f MiB at %s",
			cycle, mib(filled), mib(watermark), drained.Round(time.Millisecond), time.Since(start).Round(time.Millisecond),
			mib(lowest.free), lowest.files)
		requireAlive(t, d)
		// Every cycle's lowest point is reported, not only the first too low.
		assert.GreaterOrEqual(t, lowest.free, floor,
			"cycle %d: free space stayed at the watermark, less one commit group and Badger's next log and table; "+
				"the data directory then: %s", cycle, lowest.files)
	}

	// Another writer fills the disk while gatewayd is stopped: it starts,
	// answers 507, and accepts again when space returns.
	low.stop()
	require.NoError(t, d.stop(t, syscall.SIGTERM))
	filler := filepath.Join(mnt, "filler")
	fillDisk(t, filler)
	d = startPlainDaemon(t, dataDir, local.Endpoint, prefix, env...)
	requireAlive(t, d)
	require.Equal(t, http.StatusInsufficientStorage, push(), "a full disk answers 507")
	require.NoError(t, os.Remove(filler))
	start := time.Now()
	require.Eventually(t, func() bool { return push() == http.StatusOK }, 30*time.Second, 200*time.Millisecond,
		"accepting again once space returns, without a restart")
	t.Logf("restarted on a full disk: accepting %s after space returned", time.Since(start).Round(time.Millisecond))
	requireAlive(t, d)

	require.Eventually(t, func() bool { return d.metric(t, "gateway_buffer_pending_batches") == "0" },
		120*time.Second, 200*time.Millisecond)
	want := 0
	for _, n := range acked {
		want += n
	}
	// Reading back ~100,000 items after 10 cycles, DynamoDB Local sometimes
	// answers 500 InternalFailure: ask again. One read of the largest
	// batches' 151,000 takes over two minutes: the bound grows with them.
	var stored map[string]int
	require.Eventually(t, func() bool {
		var err error
		stored, err = view.tryReadings(hw)
		if err != nil {
			t.Logf("reading back: %v", err)
		}
		return err == nil
	}, 120*time.Second+time.Duration(want)*2*time.Millisecond, 2*time.Second)
	for k, n := range stored {
		require.Equal(t, 1, n, "reading %s stored once", k)
	}
	require.Len(t, stored, want, "every acknowledged reading is in DynamoDB")
	t.Logf("%d batches acknowledged over %d cycles, all delivered once", len(acked), attackSize(1, 10))
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// freeSample is the lowest free space a freeSampler saw and the data
// directory's files at that moment.
type freeSample struct {
	free  int64
	files string
}

// freeSampler reads a file system's free space every 25 ms and keeps the
// lowest since the last take, with the data directory's files then.
type freeSampler struct {
	mnt, dataDir string

	mu     sync.Mutex
	lowest freeSample
	done   chan struct{}
	exited chan struct{}
}

// sampleFreeSpace starts a freeSampler on mnt, listing dataDir; it stops
// at cleanup.
func sampleFreeSpace(t *testing.T, mnt, dataDir string) *freeSampler {
	s := &freeSampler{mnt: mnt, dataDir: dataDir, lowest: freeSample{free: math.MaxInt64},
		done: make(chan struct{}), exited: make(chan struct{})}
	go func() {
		defer close(s.exited)
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.done:
				return
			case <-tick.C:
			}
			s.sample()
		}
	}()
	t.Cleanup(s.stop)
	return s
}

// sample reads the free space now and keeps it if it is the lowest yet.
// The test calls it too, after each request.
func (s *freeSampler) sample() {
	var st syscall.Statfs_t
	if syscall.Statfs(s.mnt, &st) != nil {
		return
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	s.mu.Lock()
	lower := free < s.lowest.free
	s.mu.Unlock()
	if !lower {
		return
	}
	files := listData(s.dataDir)
	s.mu.Lock()
	if free < s.lowest.free {
		s.lowest = freeSample{free: free, files: files}
	}
	s.mu.Unlock()
}

// take returns the lowest sample since the last take and starts over.
func (s *freeSampler) take() freeSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	low := s.lowest
	s.lowest = freeSample{free: math.MaxInt64}
	return low
}

func (s *freeSampler) stop() {
	select {
	case <-s.done:
	default:
		close(s.done)
	}
	<-s.exited
}

// listData summarises dir's files by kind (count and allocated MiB), with
// the write-ahead logs, value logs and other files by name.
func listData(dir string) string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err.Error()
	}
	var ssts, sstBytes int64
	var named []string
	for _, e := range ents {
		info, err := e.Info()
		if err != nil {
			continue // deleted meanwhile
		}
		alloc := info.Size()
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			alloc = st.Blocks * 512
		}
		if strings.HasSuffix(e.Name(), ".sst") {
			ssts++
			sstBytes += alloc
			continue
		}
		if alloc >= 64<<10 {
			named = append(named, fmt.Sprintf("%s %.2f", e.Name(), mib(alloc)))
		}
	}
	return fmt.Sprintf("%d sst %.2f MiB; %s", ssts, mib(sstBytes), strings.Join(named, ", "))
}

// fillDisk writes path until the file system is full.
func fillDisk(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for {
		if _, err := f.Write(chunk); err != nil {
			require.ErrorIs(t, err, syscall.ENOSPC)
			break
		}
	}
	for _, n := range []int{64 << 10, 4 << 10, 1} {
		for {
			if _, err := f.Write(chunk[:n]); err != nil {
				break
			}
		}
	}
}

// TestReadOnlyDataDirectoryStopsCleanly makes gatewayd's data directory and
// its files immutable (chattr -R +i: every later create, write and sync
// fails with EPERM, as on a card the kernel turned read-only) while a
// device posts batches: the first failed write withholds its
// acknowledgement, /readyz fails, and gatewayd stops with one clear error
// (no panic, no SIGBUS) so that systemd restarts it. Once the disk is
// writable again, a restarted gatewayd delivers every batch that was
// acknowledged, once.
func TestReadOnlyDataDirectoryStopsCleanly(t *testing.T) {
	if testing.Short() {
		t.Skip("runs gatewayd on a tmpfs")
	}
	local, view, key, prefix := setup(t)
	dataDir := filepath.Join(t.TempDir(), "data")
	env := []string{fmt.Sprintf("GATEWAY_BUFFER_MEMTABLE_SIZE=%d", diskMemTable),
		fmt.Sprintf("GATEWAY_BUFFER_MIN_FREE_BYTES=%d", buffer.RequiredFreeBytes(diskMemTable))}
	d := startDaemon(t, dataDir, local.Endpoint, prefix, env...)
	hw := "02:00:00:00:D1:50"
	boot := uuid.NewString()
	acked := map[string]bool{}
	refused := 0
	chattr := func(flag string) {
		out, err := exec.Command("chattr", "-R", flag, dataDir).CombinedOutput()
		if err != nil && flag == "+i" {
			t.Skipf("chattr needs root and an ext4-like file system: %v: %s", err, out)
		}
		require.NoError(t, err, "%s", out)
	}
	for i := range 400 {
		if i == 40 {
			chattr("+i")
			t.Cleanup(func() { _ = exec.Command("chattr", "-R", "-i", dataDir).Run() })
		}
		code, _, results, err := tryPost(d, key, [][]byte{denseBatch(hw, boot, i)})
		if err != nil {
			break // gatewayd stopped
		}
		switch code {
		case http.StatusOK:
			acked[results[0].BatchID] = true
		default:
			refused++
		}
	}
	select {
	case err := <-d.exited:
		d.exited <- err
		require.Error(t, err, "gatewayd exits non-zero")
	case <-time.After(60 * time.Second):
		t.Fatalf("gatewayd did not stop on a read-only data directory; logs:\n%s", d.logs.String())
	}
	logs := d.logs.String()
	for _, crash := range []string{"SIGBUS", "unexpected fault address", "fatal error", "panic:", "Assert failed"} {
		require.NotContains(t, logs, crash)
	}
	require.Contains(t, logs, "a write to the data directory failed")
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "level=ERROR") {
			t.Logf("gatewayd: %s", line)
		}
	}
	// The first write to meet the read-only directory may be an ingest
	// commit (its batches are refused) or the uplink recording deliveries
	// (gatewayd then stops before a request is refused): either way what
	// was acknowledged must be delivered once after the restart, below.
	t.Logf("%d batches acknowledged, %d refused before gatewayd stopped", len(acked), refused)

	chattr("-i")
	d = startDaemon(t, dataDir, local.Endpoint, prefix, env...)
	require.Eventually(t, func() bool { return d.metric(t, "gateway_buffer_pending_batches") == "0" },
		60*time.Second, 200*time.Millisecond)
	stored := view.readings(t, hw)
	for k, n := range stored {
		require.Equal(t, 1, n, "reading %s stored once", k)
	}
	markers := view.markers(t)
	for id := range acked {
		require.Equal(t, 1, markers[id], "acknowledged batch %s delivered once", id)
	}
}

// TestFailingDiskEIO runs gatewayd on the fault-injecting file system and,
// under load, makes every fsync of its data directory fail with EIO (then,
// in a second round, every write): gatewayd withholds the acknowledgement
// of what it could not sync, stops with one clear line and no crash, and
// once the disk works again a restart delivers every acknowledged batch
// exactly once.
func TestFailingDiskEIO(t *testing.T) {
	if testing.Short() {
		t.Skip("runs gatewayd on a FUSE file system")
	}
	failingDiskRounds(t, "02:00:00:00:D1:E0", nil, 200,
		diskFault{faultfs.Rule{Op: faultfs.OpFsync, Err: syscall.EIO}, "input/output error"},
		diskFault{faultfs.Rule{Op: faultfs.OpWrite, Err: syscall.EIO}, "input/output error"})
}

// diskFault is one round of failingDiskRounds: a fault rule and the error
// gatewayd must say it stopped on.
type diskFault struct {
	rule faultfs.Rule
	says string
}

// failingDiskRounds runs gatewayd (with env) on the fault-injecting file
// system once a fault: 20 batches acknowledged, then the fault injected
// while device hw posts up to sends batches more, until gatewayd stops
// with one clear line and no crash; once the faults are cleared, a last
// gatewayd delivers every acknowledged batch exactly once.
func failingDiskRounds(t *testing.T, hw string, env []string, sends int, faults ...diskFault) {
	t.Helper()
	ffs := mountPowerCutDisk(t)
	local, view, key, prefix := setup(t)
	dataDir := powerCutDataDir(t, ffs)
	boot := uuid.NewString()
	acked := map[string]bool{}
	next := 0
	for _, f := range faults {
		d := startDaemon(t, dataDir, local.Endpoint, prefix, env...)
		for range 20 {
			code, _, results, err := tryPost(d, key, [][]byte{denseBatch(hw, boot, next)})
			next++
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, code)
			acked[results[0].BatchID] = true
		}
		id := ffs.Inject(f.rule)
		refused, sent := 0, 0
		for ; sent < sends; sent++ {
			code, _, results, err := tryPost(d, key, [][]byte{denseBatch(hw, boot, next)})
			next++
			if err != nil {
				break // gatewayd stopped
			}
			if code == http.StatusOK {
				acked[results[0].BatchID] = true
			} else {
				refused++
			}
		}
		select {
		case err := <-d.exited:
			d.exited <- err
			require.Error(t, err, "gatewayd exits non-zero")
		case <-time.After(60 * time.Second):
			t.Fatalf("gatewayd did not stop on a failing disk (%s %s: %s, %d batches sent); logs:\n%s",
				f.rule.Op, f.rule.Path, f.says, sent, d.logs.String())
		}
		logs := d.logs.String()
		for _, crash := range []string{"SIGBUS", "unexpected fault address", "fatal error", "panic:", "Assert failed", "nil pointer"} {
			require.NotContains(t, logs, crash, "%s %s", f.rule.Op, f.rule.Path)
		}
		require.Contains(t, logs, "a write to the data directory failed")
		require.Contains(t, logs, f.says)
		require.Positive(t, ffs.Failed(id), "the fault (%s %s) was hit", f.rule.Op, f.rule.Path)
		t.Logf("%s %s (%s): %d batches sent, %d refused before gatewayd stopped", f.rule.Op, f.rule.Path, f.says, sent, refused)
		ffs.ClearFaults()
	}
	d := startDaemon(t, dataDir, local.Endpoint, prefix, env...)
	require.Eventually(t, func() bool { return d.metric(t, "gateway_buffer_pending_batches") == "0" },
		60*time.Second, 200*time.Millisecond)
	markers := view.markers(t)
	for id := range acked {
		require.Equal(t, 1, markers[id], "acknowledged batch %s delivered once", id)
	}
	for k, n := range view.readings(t, hw) {
		require.Equal(t, 1, n, "reading %s stored once", k)
	}
	t.Logf("%d acknowledged batches delivered once after the disk recovered", len(acked))
}
