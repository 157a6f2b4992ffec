package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
)

const (
	hwA = "AA:BB:CC:DD:EE:01"
	hwB = "AA:BB:CC:DD:EE:02"
)

// ctl runs gatewayctl in-process with the given environment.
func ctl(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), args, &stdout, &stderr, func(k string) string { return env[k] })
	r := result{code: code, stdout: stdout.String(), stderr: stderr.String()}
	t.Logf("gatewayctl %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	return r
}

func batchEntry(hw string, n int) buffer.Entry {
	id := fmt.Sprintf("%s_boot_%d", hw, n)
	payload := fmt.Sprintf(`{"batch_id":"%s","hardware_id":"%s","readings":[{"timestamp_ms":%d,"sensors":{"t":21.5}}]}`,
		id, hw, 1_700_000_000_000+n)
	return buffer.Entry{BatchID: id, HardwareID: hw, Hash: sha256.Sum256([]byte(payload)), Payload: []byte(payload),
		ReceivedAt: time.UnixMilli(1_700_000_000_000 + int64(n)*1000)}
}

const deadReason = "ValidationException: Item size has exceeded the maximum allowed size"

// fixture is a buffer holding, for hwA, batch 0 delivered, 1 dead-lettered,
// 2 and 3 pending, and for hwB, batch 4 pending. With reg it stays open.
type fixture struct {
	dir             string
	delivered, dead string
	pending         []string
	buf             *buffer.Buffer
}

func newFixture(t *testing.T, keepOpen bool, opts ...func(*buffer.Buffer)) fixture {
	t.Helper()
	dir := t.TempDir()
	b, err := buffer.Open(dir, buffer.Options{}, nil, nil)
	require.NoError(t, err)
	entries := []buffer.Entry{batchEntry(hwA, 0), batchEntry(hwA, 1), batchEntry(hwA, 2), batchEntry(hwA, 3), batchEntry(hwB, 4)}
	out, err := b.Commit(context.Background(), entries)
	require.NoError(t, err)
	require.Equal(t, []buffer.Outcome{buffer.Stored, buffer.Stored, buffer.Stored, buffer.Stored, buffer.Stored}, out)
	ps, err := b.Pending(0, 10)
	require.NoError(t, err)
	require.NoError(t, b.MarkDelivered(ps[:1]))
	require.NoError(t, b.DeadLetter(ps[1], deadReason))
	f := fixture{dir: dir, delivered: ps[0].BatchID, dead: ps[1].BatchID,
		pending: []string{ps[2].BatchID, ps[3].BatchID, ps[4].BatchID}}
	if keepOpen {
		f.buf = b
		t.Cleanup(func() { require.NoError(t, b.Close()) })
	} else {
		require.NoError(t, b.Close())
	}
	return f
}

func pendingIDs(t *testing.T, dir string) []string {
	t.Helper()
	b, err := buffer.Open(dir, buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Close()) }()
	ps, err := b.Pending(0, 100)
	require.NoError(t, err)
	var ids []string
	for _, p := range ps {
		ids = append(ids, p.BatchID)
	}
	return ids
}

func TestBufferInspect(t *testing.T) {
	f := newFixture(t, false)
	r := ctl(t, nil, "buffer", "inspect", "--data-dir", f.dir)
	require.Equal(t, exitOK, r.code)
	for _, want := range []string{
		"integrity: the checks gatewayd runs at start passed",
		"clean shutdown: yes",
		"pending: 3 batches",
		"oldest received 2023-11-14T22:13:22Z, newest 2023-11-14T22:13:24Z",
		"pending by device (2 devices, top 2):",
		"delivered markers kept: 1",
		"dead letters: 1",
		f.dead,
		deadReason,
		"state records: 0",
		"budget use",
		"files on disk",
	} {
		require.Contains(t, r.stdout, want)
	}
	lines := strings.Split(r.stdout, "\n")
	require.Contains(t, findLine(t, lines, "  "+hwA), "2 batches", "the device with most pending comes first")

	r = ctl(t, map[string]string{envDataDir: f.dir}, "buffer", "inspect", "--json", "--top", "1")
	require.Equal(t, exitOK, r.code)
	var in buffer.Inspection
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &in))
	require.Equal(t, int64(3), in.PendingBatches)
	require.Equal(t, 2, in.DeviceCount)
	require.Equal(t, []buffer.DeviceCount{{HardwareID: hwA, Batches: 2, Bytes: in.Devices[0].Bytes}}, in.Devices)
	require.Equal(t, int64(1), in.DeliveredMarkers)
	require.Len(t, in.DeadLetters, 1)
	require.Equal(t, deadReason, in.DeadLetters[0].Reason)
	require.True(t, in.CleanShutdown)

	require.FileExists(t, filepath.Join(f.dir, "GATEWAY-CLEAN-SHUTDOWN"), "a read-only inspection leaves the directory as it was")
	require.Equal(t, f.pending, pendingIDs(t, f.dir))
}

// readNDJSON parses export output back, line by line.
func readNDJSON(t *testing.T, data string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(data))
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m), "line %q", sc.Text())
		out = append(out, m)
	}
	require.NoError(t, sc.Err())
	return out
}

func TestBufferExport(t *testing.T) {
	f := newFixture(t, false)
	tests := []struct {
		name string
		args []string
		want []string // state:batch_id
	}{
		{"all", nil, []string{"pending:" + f.pending[0], "pending:" + f.pending[1], "pending:" + f.pending[2], "dead:" + f.dead}},
		{"pending", []string{"--what", "pending"}, []string{"pending:" + f.pending[0], "pending:" + f.pending[1], "pending:" + f.pending[2]}},
		{"dead", []string{"--what", "dead"}, []string{"dead:" + f.dead}},
		{"one device", []string{"--hardware-id", hwB}, []string{"pending:" + f.pending[2]}},
		{"no such device", []string{"--hardware-id", "AA:BB:CC:DD:EE:99"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ctl(t, nil, append([]string{"buffer", "export", "--data-dir", f.dir}, tt.args...)...)
			require.Equal(t, exitOK, r.code)
			require.Contains(t, r.stderr, fmt.Sprintf("exported %d batches to stdout", len(tt.want)))
			var got []string
			for _, line := range readNDJSON(t, r.stdout) {
				payload, ok := line["payload"].(map[string]any)
				require.True(t, ok, "the payload is JSON, not a string: %v", line["payload"])
				require.Equal(t, line["batch_id"], payload["batch_id"])
				require.Equal(t, line["hardware_id"], payload["hardware_id"])
				_, err := time.Parse(time.RFC3339Nano, line["received_at"].(string))
				require.NoError(t, err)
				if line["state"] == "dead" {
					require.Equal(t, deadReason, line["reason"])
					require.NotEmpty(t, line["dead_lettered_at"])
				} else {
					require.NotZero(t, line["seq"])
				}
				got = append(got, fmt.Sprintf("%s:%s", line["state"], line["batch_id"]))
			}
			require.Equal(t, tt.want, got)
		})
	}

	out := filepath.Join(t.TempDir(), "export.ndjson")
	r := ctl(t, nil, "buffer", "export", "--data-dir", f.dir, "--out", out)
	require.Equal(t, exitOK, r.code)
	require.Empty(t, r.stdout)
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Len(t, readNDJSON(t, string(data)), 4)
	r = ctl(t, nil, "buffer", "export", "--data-dir", f.dir, "--out", out)
	require.Equal(t, exitError, r.code)
	require.Contains(t, r.stderr, "file exists", "an existing file is not overwritten")

	r = ctl(t, nil, "buffer", "export", "--data-dir", f.dir, "--what", "delivered")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, `--what: "delivered" is not one of pending, dead, all`)
}

func TestBufferDeadLettersAndReforwardOffline(t *testing.T) {
	f := newFixture(t, false)
	r := ctl(t, nil, "buffer", "dead-letters", "--data-dir", f.dir)
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stdout, "dead letters: 1")
	require.Contains(t, findLine(t, strings.Split(r.stdout, "\n"), "  "+f.dead), deadReason)

	r = ctl(t, nil, "buffer", "reforward", "--data-dir", f.dir, f.dead)
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stdout, "re-forwarded "+f.dead)
	require.Equal(t, append(append([]string{}, f.pending...), f.dead), pendingIDs(t, f.dir), "queued again at the end")

	tests := []struct {
		name, id string
		want     string
	}{
		{"again", f.dead, "refusing: " + f.dead + " is pending"},
		{"pending", f.pending[0], "refusing: " + f.pending[0] + " is pending"},
		{"delivered", f.delivered, "refusing: " + f.delivered + " was delivered at"},
		{"unknown", "AA:BB:CC:DD:EE:01_boot_99", "no batch AA:BB:CC:DD:EE:01_boot_99 in the buffer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ctl(t, nil, "buffer", "reforward", "--data-dir", f.dir, tt.id)
			require.Equal(t, exitError, r.code)
			require.Contains(t, r.stderr, tt.want)
		})
	}
	r = ctl(t, nil, "buffer", "dead-letters", "--data-dir", f.dir, "--json")
	require.Equal(t, exitOK, r.code)
	var list struct {
		Count       int                 `json:"count"`
		DeadLetters []buffer.DeadLetter `json:"dead_letters"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &list))
	require.Zero(t, list.Count)
	require.Empty(t, list.DeadLetters)
}

func TestBufferCommandsRefuseADirectoryInUse(t *testing.T) {
	f := newFixture(t, true)
	for _, args := range [][]string{
		{"buffer", "inspect", "--data-dir", f.dir},
		{"buffer", "export", "--data-dir", f.dir},
		{"buffer", "dead-letters", "--data-dir", f.dir},
		{"buffer", "reforward", "--data-dir", f.dir, f.dead},
	} {
		t.Run(args[1], func(t *testing.T) {
			r := ctl(t, nil, args...)
			require.Equal(t, exitError, r.code)
			require.Contains(t, r.stderr, "the buffer is in use by a running gatewayd; stop it or use gatewayctl status")
			require.Empty(t, r.stdout)
		})
	}
	state, err := f.buf.Lookup(f.dead)
	require.NoError(t, err)
	require.Equal(t, "dead", state, "the running buffer is undisturbed")
}

func TestBufferCommandUsage(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"buffer", "inspect"}, exitUsage, "--data-dir: missing"},
		{[]string{"buffer", "inspect", "--data-dir", dir}, exitError, "no buffer at " + dir},
		{[]string{"buffer", "reforward", "x"}, exitUsage, "give --data-dir DIR (gatewayd stopped) or --url URL (gatewayd running)"},
		{[]string{"buffer", "reforward", "--data-dir", dir, "--url", "http://127.0.0.1:1", "x"}, exitUsage, "not both"},
		{[]string{"buffer", "reforward", "--data-dir", dir}, exitUsage, "want (--data-dir DIR | --url URL) BATCH_ID"},
		{[]string{"buffer", "reforward", "--data-dir", dir, "x"}, exitError, "no buffer at " + dir},
		{[]string{"buffer", "dead-letters", "--url", "ftp://x"}, exitUsage, `--url: "ftp://x" is not an http:// or https:// URL`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			r := ctl(t, nil, tt.args...)
			require.Equal(t, tt.code, r.code)
			require.Contains(t, r.stderr, tt.want)
		})
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, entries, "nothing is created in a directory holding no buffer")
}
