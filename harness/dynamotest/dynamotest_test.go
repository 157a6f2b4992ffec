//go:build unix

package dynamotest

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/harness/proc"
	"greenhouse-gateway/internal/cloud"
)

func TestMain(m *testing.M) {
	if os.Getenv(orphanEnv) != "" {
		orphanChild()
		return
	}
	Main(m)
}

func TestSharedNewTables(t *testing.T) {
	t.Parallel()
	db := Shared(t)
	require.Same(t, db, Shared(t))
	require.Equal(t, "http://127.0.0.1:"+strconv.Itoa(db.Port), db.Endpoint)
	require.Same(t, db.Client(t), db.Client(t))

	a, b := db.NewTables(t), db.NewTables(t)
	require.NotEqual(t, a, b)
	out, err := db.Client(t).ListTables(t.Context(), &dynamodb.ListTablesInput{})
	require.NoError(t, err)
	for _, name := range append(a.All(), b.All()...) {
		require.Contains(t, out.TableNames, name)
	}
	require.True(t, strings.HasSuffix(a.APIKeys, "_api_keys"), a.APIKeys)
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	db := Start(t)
	client := db.Client(t, cloud.WithRetryMaxAttempts(1))
	list := func(timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(t.Context(), timeout)
		defer cancel()
		_, err := client.ListTables(ctx, &dynamodb.ListTablesInput{Limit: aws.Int32(1)})
		return err
	}
	require.NoError(t, list(5*time.Second))

	db.Pause(t)
	err := list(300 * time.Millisecond)
	require.ErrorIs(t, err, context.DeadlineExceeded, "a paused instance must hang, not fail fast")

	db.Resume(t)
	require.NoError(t, list(5*time.Second))
}

func TestStop(t *testing.T) {
	t.Parallel()
	db := Start(t)
	pid := db.proc.Pid()
	db.Stop()
	require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "the JVM must be gone after Stop")
	db.Stop() // idempotent

	err := db.signal(syscall.SIGCONT)
	require.ErrorContains(t, err, "has exited")
}

func TestStopPaused(t *testing.T) {
	t.Parallel()
	db := Start(t)
	pid := db.proc.Pid()
	db.Pause(t)
	db.Stop()
	require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH)
}

func TestStartFailureShowsLog(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "DynamoDBLocal.jar"), []byte("not a jar"), 0o644))
	java, err := exec.LookPath("java")
	require.NoError(t, err)

	begin := time.Now()
	_, err = launch(java, dir)
	require.ErrorContains(t, err, "exited during startup")
	require.ErrorContains(t, err, "jvm log tail:")
	require.ErrorContains(t, err, "Invalid or corrupt jarfile")
	require.Less(t, time.Since(begin), 30*time.Second, "an exiting JVM must not wait for the start timeout")
}

// orphanEnv makes the test binary act as a test process that dies without cleanup.
const orphanEnv = "DYNAMOTEST_ORPHAN_CHILD"

// orphanChild starts DynamoDB Local, prints the JVM's pid and panics: no Stop, no cleanup.
func orphanChild() {
	l, err := start()
	if err != nil {
		os.Stdout.WriteString("error " + err.Error() + "\n")
		os.Exit(3)
	}
	os.Stdout.WriteString(strconv.Itoa(l.proc.Pid()) + "\n")
	panic("test process dies with dynamodb local running")
}

// TestJVMDiesWithTestProcess checks the parent-death signal: a test process that panics
// without stopping its instance takes the JVM with it.
func TestJVMDiesWithTestProcess(t *testing.T) {
	if !proc.HasPdeathsig() {
		t.Skip("no parent-death signal on this system")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), orphanEnv+"=1")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	require.NoError(t, err, "child said %q", line)

	err = cmd.Wait()
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr, "the child must die of its panic")

	require.Eventually(t, func() bool { return !alive(pid) }, 10*time.Second, 50*time.Millisecond,
		"JVM %d outlived its test process", pid)
}

// alive reports whether pid is a live process; a zombie (dead, not yet reaped by its new
// parent) is not.
func alive(pid int) bool {
	if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// pid (comm) state ...: comm may contain spaces and parentheses, so split at the last ')'.
	i := strings.LastIndexByte(string(stat), ')')
	return i < 0 || !strings.HasPrefix(string(stat[i+1:]), " Z")
}
