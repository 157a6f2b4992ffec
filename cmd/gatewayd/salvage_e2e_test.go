package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/internal/cloud"
)

// TestSalvagedBufferIsForwarded: gatewayd acknowledges 800 batches while
// DynamoDB is paused and stops; 64 bytes of one of its tables are changed
// and its MANIFEST deleted. gatewayd refuses the directory with exit
// status 65, naming the salvage command; the salvage leaves the directory
// as it was and recovers every batch but those of the damaged block, and
// gatewayd started on the salvaged buffer forwards each of them once.
func TestSalvagedBufferIsForwarded(t *testing.T) {
	if testing.Short() {
		t.Skip("runs gatewayd")
	}
	src := ackBacklog(t, "02:00:00:00:AA:33", 40, syscall.SIGTERM)
	local, view, prefix, dataDir, env, acked := src.local, src.view, src.prefix, src.dataDir, src.env, src.acked

	tables, _ := filepath.Glob(filepath.Join(dataDir, "*.sst"))
	require.GreaterOrEqual(t, len(tables), 2)
	slices.SortFunc(tables, func(a, b string) int { return int(fileSize(t, b) - fileSize(t, a)) })
	f, err := os.OpenFile(tables[0], os.O_RDWR, 0)
	require.NoError(t, err)
	junk := []byte(strings.Repeat("\xa5", 64))
	_, err = f.WriteAt(junk, fileSize(t, tables[0])/2)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.NoError(t, os.Remove(filepath.Join(dataDir, "MANIFEST")))

	refused := startRefused(t, dataDir, local.Endpoint, prefix, env...)
	require.Contains(t, refused, "gatewayctl buffer salvage --data-dir "+dataDir+" --out NEWDIR")

	before := digest(t, dataDir)
	out := filepath.Join(t.TempDir(), "salvaged")
	rep, err := buffer.Salvage(context.Background(), dataDir, out, nil)
	require.NoError(t, err)
	require.Equal(t, before, digest(t, dataDir), "the damaged directory is unchanged")
	require.Len(t, rep.Skipped, 1, "one block: %+v", rep.Skipped)
	require.Equal(t, filepath.Base(tables[0]), rep.Skipped[0].File)
	lost := len(acked) - rep.PendingBatches
	require.Positive(t, lost)
	require.Less(t, lost, 10, "a 16 KiB block holds a few batches of 2.7 KiB")
	t.Logf("%d acknowledged batches, %d recovered, %d lost with block %d of %s",
		len(acked), rep.PendingBatches, lost, rep.Skipped[0].Block, rep.Skipped[0].File)

	d := startPlainDaemon(t, out, local.Endpoint, prefix, env...)
	require.Eventually(t, func() bool { return d.metric(t, "gateway_buffer_pending_batches") == "0" }, 120*time.Second, 200*time.Millisecond)
	requireDeliveredOnce(t, d, int64(rep.PendingBatches))
	markers := view.markers(t)
	require.Len(t, markers, 1+rep.PendingBatches)
	missing := 0
	for _, id := range acked {
		if markers[id] == 0 {
			missing++
		}
	}
	require.Equal(t, lost, missing)
	require.NoError(t, d.stop(t, syscall.SIGTERM))
}

// salvageSource is a data directory gatewayd acknowledged a backlog into
// while DynamoDB was paused, and what it needs to forward it.
type salvageSource struct {
	local   *dynamotest.Local
	view    cloudView
	prefix  string
	dataDir string
	env     []string
	acked   []string // in order; the first batch, delivered before the pause, not among them
}

// ackBacklog has gatewayd deliver one batch of hw, then acknowledge posts
// requests of 20 batches with DynamoDB paused, and stops it with sig.
func ackBacklog(t *testing.T, hw string, posts int, sig syscall.Signal) salvageSource {
	t.Helper()
	local := dynamotest.Start(t)
	src := salvageSource{local: local, view: cloudView{client: local.Client(t), tables: local.NewTables(t)},
		dataDir: filepath.Join(t.TempDir(), "data"),
		env:     []string{"GATEWAY_BUFFER_MEMTABLE_SIZE=1048576", "GATEWAY_BUFFER_HISTORY_RETENTION=-1s"}}
	key, _, err := cloud.NewKeys(src.view.client, src.view.tables.APIKeys, e2ePepper).Create(context.Background(), "salvage")
	require.NoError(t, err)
	src.prefix = strings.TrimSuffix(src.view.tables.Devices, "devices")
	d := startPlainDaemon(t, src.dataDir, local.Endpoint, src.prefix, src.env...)
	boot := uuid.NewString()
	code, _, _ := postBatches(t, d, key, [][]byte{denseBatch(hw, boot, 0)}) // the key is verified and cached
	require.Equal(t, 200, code)
	require.Eventually(t, func() bool { return d.metric(t, "gateway_buffer_pending_batches") == "0" }, 60*time.Second, 100*time.Millisecond)
	local.Pause(t)
	for g := range posts {
		var batches [][]byte
		for i := range 20 {
			batches = append(batches, denseBatch(hw, boot, 1+g*20+i))
		}
		code, _, results := postBatches(t, d, key, batches)
		require.Equal(t, 200, code)
		for _, r := range results {
			src.acked = append(src.acked, r.BatchID)
		}
	}
	_ = d.stop(t, sig)
	local.Resume(t)
	return src
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	require.NoError(t, err)
	return fi.Size()
}

// digest is every file's name and content (not subdirectories).
func digest(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range ents {
		if e.IsDir() {
			continue // the audit log's
		}
		raw, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		out[e.Name()] = fmt.Sprintf("%x", raw)
	}
	return out
}

// startRefused starts gatewayd on dataDir, which it must refuse with exit
// status exitDamagedBuffer, and returns its output.
func startRefused(t *testing.T, dataDir, endpoint, prefix string, env ...string) string {
	t.Helper()
	cmd := exec.Command(gatewaydPlainBinary(t), "--data-dir", dataDir, "--dynamodb-endpoint", endpoint,
		"--table-prefix", prefix, "--mqtt-addr", freeAddr(t), "--http-addr", freeAddr(t))
	cmd.Env = append(append(os.Environ(), "GATEWAY_API_KEY_PEPPER="+e2ePepper, "AWS_ACCESS_KEY_ID=local",
		"AWS_SECRET_ACCESS_KEY=local", "AWS_REGION=us-east-1"), env...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "output:\n%s", out)
	require.Equal(t, exitDamagedBuffer, exit.ExitCode(), "output:\n%s", out)
	return string(out)
}

// TestAttackSalvageAfterKillNine: gatewayd acknowledges a backlog while
// DynamoDB is paused (3,000 batches with GATEWAY_ATTACK_FULL, 1,200
// otherwise) and is killed with SIGKILL, so its last batches are only in
// the write-ahead log. Four copies of the directory are damaged four
// ways: 64 bytes changed in the largest table, the largest table cut to
// half its length, the newest write-ahead log cut inside its written
// part, the MANIFEST deleted. For each, gatewayd refuses with exit status
// 65 naming the salvage command, `gatewayctl buffer inspect` refuses with
// the same diagnosis, the salvage leaves the copy unchanged and loses no
// more batches than the removed bytes can have held, and gatewayd started
// on the salvaged buffer forwards every recovered batch once into tables
// of its own.
func TestAttackSalvageAfterKillNine(t *testing.T) {
	if testing.Short() {
		t.Skip("runs gatewayd")
	}
	posts := 60
	if attackFull() {
		posts = 150
	}
	src := ackBacklog(t, "02:00:00:00:AA:34", posts, syscall.SIGKILL)
	local, view, prefix, source, env := src.local, src.view, src.prefix, src.dataDir, src.env
	acked := map[string]bool{}
	for _, id := range src.acked {
		acked[id] = true
	}
	ctl := gatewayctlBinary(t)

	largestTable := func(t *testing.T, dir string) string {
		tables, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
		require.NotEmpty(t, tables)
		slices.SortFunc(tables, func(a, b string) int { return int(fileSize(t, b) - fileSize(t, a)) })
		return tables[0]
	}
	// A denseBatch is about 2.7 KiB of digits: a write-ahead log holds it
	// as it is, a table block compressed, to no less than 512 bytes.
	cases := []struct {
		name string
		// minStored bounds a batch's stored size in the damaged file from
		// below.
		minStored int64
		// damage damages dir and returns how many bytes of records it
		// removed or spoiled (0: none, every batch must come back).
		damage func(t *testing.T, dir string) int64
	}{
		{"64 bytes changed in a table", 512, func(t *testing.T, dir string) int64 {
			victim := largestTable(t, dir)
			f, err := os.OpenFile(victim, os.O_RDWR, 0)
			require.NoError(t, err)
			_, err = f.WriteAt([]byte(strings.Repeat("\xa5", 64)), fileSize(t, victim)/2)
			require.NoError(t, err)
			require.NoError(t, f.Close())
			return 16 << 10 // one block
		}},
		{"a table cut to half", 512, func(t *testing.T, dir string) int64 {
			victim := largestTable(t, dir)
			size := fileSize(t, victim)
			require.NoError(t, os.Truncate(victim, size/2))
			return size - size/2
		}},
		{"a write-ahead log cut inside its records", 2 << 10, func(t *testing.T, dir string) int64 {
			mems, _ := filepath.Glob(filepath.Join(dir, "*.mem"))
			require.NotEmpty(t, mems)
			slices.SortFunc(mems, func(a, b string) int { return strings.Compare(b, a) })
			var victim string
			var written int
			for _, m := range mems { // the newest log with records
				raw, err := os.ReadFile(m)
				require.NoError(t, err)
				if written = len(bytes.TrimRight(raw, "\x00")); written > 64<<10 {
					victim = m
					break
				}
			}
			require.NotEmpty(t, victim, "a write-ahead log holds the last batches after SIGKILL")
			cut := int64(written/2 + 7)
			require.NoError(t, os.Truncate(victim, cut))
			return int64(written) - cut
		}},
		{"the MANIFEST deleted", 512, func(t *testing.T, dir string) int64 {
			require.NoError(t, os.Remove(filepath.Join(dir, "MANIFEST")))
			return 0
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			out, err := exec.Command("cp", "-a", source, dir).CombinedOutput()
			require.NoError(t, err, "%s", out)
			spoiled := tc.damage(t, dir)

			refused := startRefused(t, dir, local.Endpoint, prefix, env...)
			require.Contains(t, refused, "gatewayctl buffer salvage --data-dir "+dir+" --out NEWDIR")
			inspect := runCtl(t, ctl, nil, "buffer", "inspect", "--data-dir", dir)
			require.NotZero(t, inspect.code)
			require.Contains(t, refused, "is damaged")
			diagnosis := refused[strings.Index(refused, "is damaged"):]
			diagnosis, _, _ = strings.Cut(diagnosis, ";")
			require.Contains(t, inspect.stderr, diagnosis, "inspect gives gatewayd's diagnosis")

			before := digest(t, dir)
			salvaged := filepath.Join(t.TempDir(), "salvaged")
			rep, err := buffer.Salvage(context.Background(), dir, salvaged, nil)
			require.NoError(t, err)
			require.Equal(t, before, digest(t, dir), "the damaged directory is unchanged")

			tables := local.NewTables(t)
			cloudOf := cloudView{client: view.client, tables: tables}
			g := startPlainDaemon(t, salvaged, local.Endpoint, strings.TrimSuffix(tables.Devices, "devices"), env...)
			require.Eventually(t, func() bool { return g.metric(t, "gateway_buffer_pending_batches") == "0" },
				120*time.Second, 200*time.Millisecond)
			requireDeliveredOnce(t, g, int64(rep.PendingBatches))
			require.NoError(t, g.stop(t, syscall.SIGTERM))
			markers := cloudOf.markers(t)
			require.Len(t, markers, rep.PendingBatches)
			lost := 0
			for id := range acked {
				if markers[id] == 0 {
					lost++
				}
			}
			require.LessOrEqual(t, int64(lost)*tc.minStored, spoiled,
				"%d of %d batches lost, more than %d damaged bytes can hold; skipped %+v", lost, len(acked), spoiled, rep.Skipped)
			if spoiled > 0 {
				require.NotEmpty(t, rep.Skipped)
			}
			t.Logf("%s: %d acknowledged batches, %d recovered and delivered once, %d lost; skipped %+v",
				tc.name, len(acked), len(acked)-lost, lost, rep.Skipped)
		})
	}
}

// requireDeliveredOnce checks, once d's backlog is drained, that its
// uplink wrote n batches and found none in the cloud already: the markers
// table, keyed by batch_id, cannot tell a batch written twice.
func requireDeliveredOnce(t *testing.T, d *daemon, n int64) {
	t.Helper()
	require.Equal(t, strconv.FormatInt(n, 10), d.metric(t, `gateway_uplink_batches_total{result="delivered"}`))
	require.Contains(t, []string{"", "0"}, d.metric(t, `gateway_uplink_batches_total{result="already_delivered"}`))
}
