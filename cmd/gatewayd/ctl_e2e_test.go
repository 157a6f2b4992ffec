package main

import (
	"bytes"
	"context"
	"io"
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
)

// gatewayctlBinary builds gatewayctl for this test.
func gatewayctlBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gatewayctl")
	out, err := exec.Command("go", "build", "-o", bin, "../gatewayctl").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

type ctlResult struct {
	code           int
	stdout, stderr string
}

func runCtl(t *testing.T, bin string, env []string, args ...string) ctlResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	_ = cmd.Run()
	r := ctlResult{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
	t.Logf("gatewayctl %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	return r
}

// TestGatewayctlAgainstGatewayd runs gatewayctl against the real gatewayd:
// status while it runs, the buffer commands refused while it holds the data
// directory, and inspection after a clean stop and after kill -9, each
// followed by a start that finds the directory as gatewayd left it.
func TestGatewayctlAgainstGatewayd(t *testing.T) {
	local, _, key, prefix := setup(t)
	ctl := gatewayctlBinary(t)
	dir := t.TempDir()
	const token = "e2e-admin-token"
	d := startDaemon(t, dir, local.Endpoint, prefix, "GATEWAY_ADMIN_TOKEN="+token)
	url := "http://" + d.httpAddr

	hw := "02:00:00:00:AA:40"
	boot := uuid.NewString()
	body := `{"batches":[` + string(batch(hw, boot, 0, 2)) + `,` + string(batch(hw, boot, 1, 2)) + `]}`
	req, err := http.NewRequest(http.MethodPost, url+"/v1/readings", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(raw))
	require.Eventually(t, func() bool { return d.metric(t, "gateway_buffer_delivered_batches_total") == "2" },
		60*time.Second, 100*time.Millisecond)

	r := runCtl(t, ctl, []string{"GATEWAY_ADMIN_TOKEN=" + token}, "status", "--url", url)
	require.Equal(t, 0, r.code)
	require.Contains(t, r.stdout, "gatewayd at "+url+": ready")
	require.Contains(t, r.stdout, "devices: 1 known")
	require.Contains(t, r.stdout, "dead letters: 0")
	r = runCtl(t, ctl, []string{"GATEWAY_ADMIN_TOKEN=wrong"}, "status", "--url", url)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "admin token rejected")

	for _, args := range [][]string{
		{"buffer", "inspect", "--data-dir", dir},
		{"buffer", "export", "--data-dir", dir},
		{"buffer", "reforward", "--data-dir", dir, "x"},
	} {
		r := runCtl(t, ctl, nil, args...)
		require.Equal(t, 1, r.code)
		require.Contains(t, r.stderr, "the buffer is in use by a running gatewayd; stop it or use gatewayctl status")
	}

	require.NoError(t, d.stop(t, syscall.SIGTERM))
	r = runCtl(t, ctl, nil, "status", "--url", url)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "gatewayd is not answering on "+url)

	r = runCtl(t, ctl, nil, "buffer", "inspect", "--data-dir", dir)
	require.Equal(t, 0, r.code)
	require.Contains(t, r.stdout, "clean shutdown: yes")
	require.Contains(t, r.stdout, "pending: 0 batches")
	require.Contains(t, r.stdout, "delivered markers kept: 2")
	require.Contains(t, r.stdout, "state records:")
	require.Empty(t, r.stderr)
	r = runCtl(t, ctl, nil, "buffer", "export", "--data-dir", dir)
	require.Equal(t, 0, r.code)
	require.Empty(t, r.stdout)
	require.Contains(t, r.stderr, "exported 0 batches to stdout")

	// The read-only inspection left the clean-shutdown record: gatewayd
	// still finds its counts matching.
	d = startDaemon(t, dir, local.Endpoint, prefix, "GATEWAY_ADMIN_TOKEN="+token)
	_ = d.stop(t, syscall.SIGKILL) // "signal: killed"
	r = runCtl(t, ctl, nil, "buffer", "inspect", "--data-dir", dir)
	require.Equal(t, 0, r.code)
	require.Contains(t, r.stderr, "gatewayd did not stop cleanly")
	require.Contains(t, r.stdout, "clean shutdown: no")
	require.Contains(t, r.stdout, "delivered markers kept: 2")
	startDaemon(t, dir, local.Endpoint, prefix)
}
