package deploy_test

import (
	"context"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/internal/dynamotest"
)

func TestMain(m *testing.M) { dynamotest.Main(m) }

// aptTimeout bounds one apt-get run.
const aptTimeout = 10 * time.Minute

var installMu sync.Mutex

// ensureTool returns the path of bin, installing the Debian package pkg with apt-get when bin
// is missing (as root; otherwise the test fails and says what to install). Under -short the
// test is skipped instead: these are the tests that may need apt.
func ensureTool(t *testing.T, bin, pkg string) string {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short: this test needs %s (Debian package %s)", bin, pkg)
	}
	installMu.Lock()
	defer installMu.Unlock()
	if path, err := exec.LookPath(bin); err == nil {
		return path
	}
	if os.Geteuid() != 0 {
		t.Fatalf("%s is missing: install the Debian package %s (apt-get install %s); the test installs it only when run as root", bin, pkg, pkg)
	}
	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), aptTimeout)
	defer cancel()
	apt := func(args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		return cmd.CombinedOutput()
	}
	// The lock timeout waits for another apt run (a test package running in parallel)
	// instead of failing on its lock.
	install := []string{"install", "-y", "--no-install-recommends", "-o", "DPkg::Lock::Timeout=300", pkg}
	out, err := apt(install...)
	if err != nil {
		// A fresh machine may have no (or stale) package lists.
		if upd, uerr := apt("update"); uerr != nil {
			t.Fatalf("apt-get update: %v\n%s", uerr, upd)
		}
		out, err = apt(install...)
	}
	require.NoError(t, err, "apt-get install %s:\n%s", pkg, out)
	path, err := exec.LookPath(bin)
	require.NoError(t, err, "%s still missing after installing %s", bin, pkg)
	t.Logf("installed Debian package %s in %s", pkg, time.Since(begin).Round(time.Second))
	return path
}
