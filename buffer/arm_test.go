package buffer

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/harness/debpkg"
)

// armTests are the tests run on 32-bit ARM: open, commit, restart, pending,
// delivery, concurrent and split groups, usage, the integrity check of
// healthy directories, and memtables flushed into tables and compacted.
const armTests = "^(TestCommitOutcomes|TestPendingSurvivesRestartInOrder|TestDeliveredMarkersAnswerDuplicateUntilCollected|" +
	"TestConcurrentCommitsStoreEachBatchOnce|TestSplitGroupBeyondOneTransaction|TestUsageIsKeptAcrossEveryWriteAndRestart|" +
	"TestHealthyBuffersOpen|TestGroupWaitCommits|TestBadgerOptionsFitTheAddressSpace|" +
	"TestBatchesBeyondTheMemtablesReachTables|TestAllocatorGrowsPastItsFirstBuffer)$"

// TestOn32BitARM cross-compiles this package's tests for 32-bit ARM
// (GOARCH=arm GOARM=7, the armhf release) and runs armTests under qemu-arm
// (user-mode emulation, no binfmt needed). qemu-arm comes from Debian's
// qemu-user package, installed with apt-get when missing and running as
// root; without it the test is skipped, unless CI is set.
func TestOn32BitARM(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiles and emulates: not with -short")
	}
	if runtime.GOARCH == "arm" {
		t.Skip("already running on 32-bit ARM")
	}
	if runtime.GOOS != "linux" {
		t.Skip("qemu-arm user-mode emulation runs on Linux")
	}
	qemu, err := ensureQemuARM()
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("qemu-arm is needed: %v", err)
		}
		t.Skipf("qemu-arm unavailable: %v", err)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	testBin := filepath.Join(t.TempDir(), "buffer-arm.test")
	build := exec.CommandContext(ctx, goBin, "test", "-c", "-o", testBin, ".")
	build.Env = append(os.Environ(), "GOOS=linux", "GOARCH=arm", "GOARM=7", "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "cross-compiling the tests for GOARCH=arm GOARM=7:\n%s", out)

	tmp := t.TempDir()
	run := exec.CommandContext(ctx, qemu, testBin, "-test.run", armTests, "-test.v", "-test.count=1")
	run.Env = append(os.Environ(), "TMPDIR="+tmp)
	run.WaitDelay = 5 * time.Second
	out, err = run.CombinedOutput()
	require.NoError(t, err, "the tests under qemu-arm:\n%s", tail(out, 16<<10))
	require.Contains(t, string(out), "\nPASS\n")
	for _, name := range strings.Split(strings.Trim(armTests, "^()$"), "|") {
		require.Contains(t, string(out), "--- PASS: "+name+" ", "%s ran and passed on ARM", name)
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// ensureQemuARM returns the path of qemu-arm, installing Debian's qemu-user
// when it is missing.
func ensureQemuARM() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), debpkg.Timeout)
	defer cancel()
	present := func() bool { _, err := exec.LookPath("qemu-arm"); return err == nil }
	if err := debpkg.Install(ctx, present, "qemu-user"); err != nil {
		return "", err
	}
	return exec.LookPath("qemu-arm")
}
