package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
)

// diskMemTable is the buffer's memtable in these tests (the smallest
// allowed), so that the watermark Badger needs, buffer.RequiredFreeBytes,
// fits a small tmpfs.
const diskMemTable = 1 << 20

// mountTmpfs mounts a tmpfs of size bytes on a new directory and unmounts
// it at cleanup, after the daemons started later are stopped. It skips the
// test where mounting is not permitted.
func mountTmpfs(t *testing.T, size int64) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0700", size), "tmpfs", dir).CombinedOutput()
	if err != nil {
		t.Skipf("skipping: mounting a tmpfs needs root (CAP_SYS_ADMIN), and mount said: %v: %s", err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	require.NoError(t, syscall.Statfs(dir, &st))
	return int64(st.Bavail) * int64(st.Bsize)
}

// noisyBatch is a batch of 50 readings of 8 sensors with random values:
// about 12 KiB that compress poorly, so that the disk fills quickly.
func noisyBatch(hw, boot string, i int) []byte {
	end := time.Now().Add(-7*24*time.Hour).UnixMilli() + int64(i)*60_000
	var readings []string
	for k := range 50 {
		var sensors []string
		for s := range 8 {
			sensors = append(sensors, fmt.Sprintf(`"sensor_%d":%.6f`, s, rand.Float64()*100))
		}
		readings = append(readings, fmt.Sprintf(`{"timestamp_ms":%d,"sensors":{%s}}`, end-int64(50-k)*1000, strings.Join(sensors, ",")))
	}
	return []byte(fmt.Sprintf(`{"batch_id":"%s_%s_%d_%d","hardware_id":"%s","boot_id":"%s","firmware_version":"1.0.16","seq":%d,"readings":[%s]}`,
		hw, boot, end-60_000, end, hw, boot, i, strings.Join(readings, ",")))
}

// postBatches posts batches in one request and returns the status code, the
// Retry-After header and the results. It fails t when there is no decodable
// answer.
func postBatches(t *testing.T, d *daemon, key string, batches [][]byte) (int, string, []contract.Result) {
	t.Helper()
	code, retryAfter, results, err := tryPost(d, key, batches)
	require.NoError(t, err, "gatewayd logs:\n%s", d.logs.String())
	return code, retryAfter, results
}

// tryPost is postBatches for a gatewayd that may be gone: err is the
// request's error, or the answer's when it does not decode (code is then
// set).
func tryPost(d *daemon, key string, batches [][]byte) (code int, retryAfter string, results []contract.Result, err error) {
	return tryPostWith(http.DefaultClient, d, key, batches)
}

// tryPostWith is tryPost over client.
func tryPostWith(client *http.Client, d *daemon, key string, batches [][]byte) (code int, retryAfter string, results []contract.Result, err error) {
	body := append([]byte(`{"batches":[`), bytes.Join(batches, []byte(","))...)
	body = append(body, "]}"...)
	req, err := http.NewRequest(http.MethodPost, "http://"+d.httpAddr+"/v1/readings", bytes.NewReader(body))
	if err != nil {
		return 0, "", nil, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, "", nil, fmt.Errorf("reading the answer: %w", err)
	}
	var r contract.ReadingsResponse
	if err := json.Unmarshal(raw, &r); err != nil {
		return resp.StatusCode, "", nil, fmt.Errorf("decoding %s: %w", raw, err)
	}
	return resp.StatusCode, resp.Header.Get("Retry-After"), r.Results, nil
}

// requireAlive fails when gatewayd exited or logged a crash.
func requireAlive(t *testing.T, d *daemon) {
	t.Helper()
	select {
	case err := <-d.exited:
		d.exited <- err
		t.Fatalf("gatewayd exited (%v); logs:\n%s", err, d.logs.String())
	default:
	}
	for _, crash := range []string{"SIGBUS", "unexpected fault address", "fatal error", "panic:"} {
		require.NotContains(t, d.logs.String(), crash)
	}
	resp, err := http.Get("http://" + d.httpAddr + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// TestFullDiskAnswers507ThenResumes runs gatewayd on a 48 MiB tmpfs with
// DynamoDB unreachable, so nothing drains, and a filler file leaving a few
// MiB above the free-space watermark. Devices push batches over HTTP until
// the gateway answers 507 with Retry-After; it must not crash (Badger
// writes through mmap: a full disk would be a SIGBUS). Removing the filler
// makes ingest resume. After a kill -9 and a restart, every batch that got
// a 2xx is pending.
func TestFullDiskAnswers507ThenResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs gatewayd on a tmpfs")
	}
	mnt := mountTmpfs(t, 48<<20)
	local, _, key, prefix := setup(t)
	dataDir := filepath.Join(mnt, "data")
	watermark := buffer.RequiredFreeBytes(diskMemTable)
	env := []string{fmt.Sprintf("GATEWAY_BUFFER_MEMTABLE_SIZE=%d", diskMemTable),
		fmt.Sprintf("GATEWAY_BUFFER_MIN_FREE_BYTES=%d", watermark)}
	hw := "02:00:00:00:AA:10"
	boot := uuid.NewString()

	// First run, with DynamoDB: the device's key is verified and cached in
	// the data directory.
	d := startDaemon(t, dataDir, local.Endpoint, prefix, env...)
	code, _, _ := postBatches(t, d, key, [][]byte{noisyBatch(hw, boot, 0)})
	require.Equal(t, http.StatusOK, code)
	require.NoError(t, d.stop(t, syscall.SIGTERM))

	// Leave 3 MiB above the watermark.
	filler := filepath.Join(mnt, "filler")
	fill := freeBytes(t, mnt) - watermark - 3<<20
	require.Positive(t, fill)
	require.NoError(t, os.WriteFile(filler, make([]byte, fill), 0o600))

	// Second run: DynamoDB unreachable, nothing drains.
	dead := "http://" + freeAddr(t)
	d = startDaemon(t, dataDir, dead, prefix, env...)
	acked := map[string]bool{}
	next := 1
	push := func() (int, string) {
		var batches [][]byte
		for range 40 {
			batches = append(batches, noisyBatch(hw, boot, next))
			next++
		}
		code, retryAfter, results := postBatches(t, d, key, batches)
		for _, r := range results {
			if r.Status == contract.StatusAccepted {
				acked[r.BatchID] = true
			}
		}
		return code, retryAfter
	}
	full := false
	for range 200 {
		code, retryAfter := push()
		requireAlive(t, d)
		if code == http.StatusInsufficientStorage {
			require.Equal(t, "30", retryAfter, "507 carries Retry-After (http.retry_after)")
			full = true
			break
		}
		require.Contains(t, []int{http.StatusOK, http.StatusMultiStatus}, code)
	}
	require.True(t, full, "no 507 after %d batches; free %d bytes; logs:\n%s", next, freeBytes(t, mnt), d.logs.String())
	t.Logf("507 after %d batches acknowledged; %d bytes free, watermark %d", len(acked), freeBytes(t, mnt), watermark)
	require.GreaterOrEqual(t, freeBytes(t, mnt), watermark/2, "the watermark left Badger its room")

	// It stays full, and alive, while the disk is: grow the filler 2 MiB
	// so that a background flush freeing a little cannot lift it back.
	f, err := os.OpenFile(filler, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.Write(make([]byte, 2<<20))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	for range 3 {
		code, _ := push()
		require.Equal(t, http.StatusInsufficientStorage, code)
	}
	requireAlive(t, d)
	require.NotEqual(t, "0", d.metric(t, `gateway_buffer_refused_batches_total{reason="free_space"}`))

	// Space comes back: ingest resumes.
	require.NoError(t, os.Remove(filler))
	code, _ = push()
	require.Equal(t, http.StatusOK, code, "ingest resumes once space is freed")
	requireAlive(t, d)

	// kill -9, restart: every acknowledged batch is pending.
	require.NoError(t, d.cmd.Process.Kill())
	<-d.exited
	d.exited <- nil
	d = startDaemon(t, dataDir, dead, prefix, env...)
	require.NoError(t, d.stop(t, syscall.SIGTERM))
	var buf *buffer.Buffer
	buf, err = buffer.Open(dataDir, buffer.Options{MemTableSize: diskMemTable, MinFreeBytes: watermark}, nil, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, buf.Close()) }()
	pending, err := buf.Pending(0, 1_000_000)
	require.NoError(t, err)
	have := map[string]bool{}
	for _, p := range pending {
		have[p.BatchID] = true
	}
	for id := range acked {
		require.True(t, have[id], "acknowledged batch %s is pending after the restart", id)
	}
	t.Logf("%d acknowledged batches, %d pending after the restart", len(acked), len(pending))
}

// TestDamagedBufferStopsGatewayd truncates the MANIFEST of a stopped
// gateway's buffer: gatewayd must refuse to start, exit non-zero and say
// what is wrong and what to do, and leave the data alone.
func TestDamagedBufferStopsGatewayd(t *testing.T) {
	if testing.Short() {
		t.Skip("runs gatewayd")
	}
	dataDir := t.TempDir()
	buf, err := buffer.Open(dataDir, buffer.Options{}, nil, nil)
	require.NoError(t, err)
	for i := range 20 {
		id := fmt.Sprintf("02:00:00:00:AA:11_b_%d", i)
		_, err := buf.Commit(context.Background(), []buffer.Entry{{BatchID: id, HardwareID: "02:00:00:00:AA:11",
			Payload: []byte(`{}`), ReceivedAt: time.Now()}})
		require.NoError(t, err)
	}
	require.NoError(t, buf.Close())
	manifest := filepath.Join(dataDir, "MANIFEST")
	fi, err := os.Stat(manifest)
	require.NoError(t, err)
	require.NoError(t, os.Truncate(manifest, fi.Size()-3))

	cmd := exec.Command(gatewaydBinary(t), "--data-dir", dataDir, "--dynamodb-endpoint", "http://"+freeAddr(t),
		"--mqtt-addr", freeAddr(t), "--http-addr", freeAddr(t))
	cmd.Env = append(os.Environ(), "GATEWAY_API_KEY_PEPPER="+e2ePepper, "AWS_ACCESS_KEY_ID=local",
		"AWS_SECRET_ACCESS_KEY=local", "AWS_REGION=us-east-1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("gatewayd did not exit on a damaged buffer; output:\n%s", out.String())
	}
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "output:\n%s", out.String())
	require.Equal(t, exitDamagedBuffer, exit.ExitCode(), "the status the unit does not restart on")
	t.Logf("gatewayd exited %d:\n%s", exit.ExitCode(), out.String())
	require.Contains(t, out.String(), "gatewayctl buffer salvage --data-dir "+dataDir+" --out NEWDIR")
	require.Contains(t, out.String(), "buffer at "+dataDir+" is damaged")
	require.Contains(t, out.String(), "is not listed in the MANIFEST")
	require.Contains(t, out.String(), "move the directory aside to start empty (undelivered batches in it are lost), or restore it from a backup")
	require.FileExists(t, filepath.Join(dataDir, "000001.sst"), "the data is left in place")
}

func TestBufferCapacitySettings(t *testing.T) {
	cfg, _, _, err := loadConfig(nil, []string{"GATEWAY_BUFFER_FULL_POLICY=drop_oldest"})
	require.NoError(t, err)
	require.Equal(t, buffer.PolicyDropOldest, cfg.Buffer.FullPolicy)
	cfg, _, _, err = loadConfig(nil, nil)
	require.NoError(t, err)
	require.Equal(t, buffer.PolicyRejectNew, cfg.Buffer.FullPolicy, "the default")

	tests := []struct {
		name string
		env  []string
		want string
	}{
		{"unknown policy", []string{"GATEWAY_BUFFER_FULL_POLICY=drop_newest"},
			`buffer.full_policy: "drop_newest" is not one of reject_new, drop_oldest`},
		{"watermark below what Badger may write", []string{"GATEWAY_BUFFER_MIN_FREE_BYTES=67108864"},
			"buffer.min_free_bytes: 67108864 is less than 184549376"},
		{"larger memtable, default watermark", []string{"GATEWAY_BUFFER_MEMTABLE_SIZE=67108864"},
			"buffer.min_free_bytes: 268435456 is less than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, _, err := loadConfig(nil, tt.env)
			require.ErrorContains(t, err, tt.want)
		})
	}
}
