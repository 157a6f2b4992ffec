package deploy_test

import (
	"context"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/harness/debpkg"
	"greenhouse-gateway/harness/dynamotest"
)

func TestMain(m *testing.M) { dynamotest.Main(m) }

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
	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), debpkg.Timeout)
	defer cancel()
	present := func() bool { _, err := exec.LookPath(bin); return err == nil }
	require.NoError(t, debpkg.Install(ctx, present, pkg))
	path, err := exec.LookPath(bin)
	require.NoError(t, err, "%s still missing after installing %s", bin, pkg)
	t.Logf("installed Debian package %s in %s", pkg, time.Since(begin).Round(time.Second))
	return path
}
