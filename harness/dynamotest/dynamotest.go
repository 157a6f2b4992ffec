//go:build unix

// Package dynamotest runs AWS DynamoDB Local for integration tests.
//
// A package's tests share one instance: its TestMain calls Main, tests call Shared(t) and
// NewTables(t) for a private set of the four tables under a random prefix, so tests do not
// see each other's data and may run in parallel:
//
//	func TestMain(m *testing.M) { dynamotest.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		db := dynamotest.Shared(t)
//		tables := db.NewTables(t)
//		client := db.Client(t)
//		...
//	}
//
// Start(t) gives a test its own instance instead, for tests that Pause it (hang tests) or
// otherwise disturb it.
//
// The JVM is found in <module root>/.cache/dynamodb-local/ (module root: the nearest
// directory above the working directory with a go.mod), or in $DYNAMODB_LOCAL_DIR. When it
// is missing, deploy/local/dynamodb-local.sh install is run first (this needs npm, and java
// or root for apt-get), so "go test ./..." works on a fresh machine.
//
// Lifetime: the JVM runs in its own process group, which Stop kills with SIGKILL. Start
// registers Stop with t.Cleanup and Main stops the shared instance after the tests. If the
// test process dies without running them (a panic in TestMain, os.Exit, a go test timeout,
// SIGKILL), Linux still kills the JVM: it is started with PR_SET_PDEATHSIG=SIGKILL from an OS
// thread kept alive for the JVM's lifetime. On other Unix systems there is no such signal and
// a JVM can outlive a test process killed that way; kill it by its process group. The
// package does not build on Windows.
//
// DynamoDB Local has no option to bind to loopback only: it listens on all interfaces, on a
// port picked free on 127.0.0.1.
package dynamotest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"greenhouse-gateway/harness/syncbuf"
	"greenhouse-gateway/internal/cloud"
)

const (
	// startTimeout bounds the wait for the JVM to answer requests.
	startTimeout = 60 * time.Second
	// installTimeout bounds deploy/local/dynamodb-local.sh install (npm, maybe apt-get).
	installTimeout = 10 * time.Minute
	// stopTimeout bounds the wait for the killed JVM to be reaped.
	stopTimeout = 10 * time.Second
	// startAttempts is how often Start picks a new port when the JVM cannot bind its port
	// (another process took it between our check and the JVM's bind).
	startAttempts = 3
	// logTailBytes is how much JVM output is kept for error messages.
	logTailBytes = 16 << 10
	// region is the region of test clients; DynamoDB Local ignores it (-sharedDb).
	region = "us-east-1"
)

// jvmOptions keep one test instance small and quick to start (about 1 s and 100 MB RSS).
var jvmOptions = []string{
	"-Xms16m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData",
}

// Local is one running DynamoDB Local (in memory, -sharedDb: every client sees the same
// tables whatever its credentials and region).
type Local struct {
	// Endpoint is the base URL for clients, http://127.0.0.1:<Port>.
	Endpoint string
	// Port is the TCP port the JVM listens on (on all interfaces).
	Port int
	// Dir is the DynamoDB Local installation used (DynamoDBLocal.jar and DynamoDBLocal_lib).
	Dir string

	cmd     *exec.Cmd
	log     *syncbuf.Buffer
	done    chan struct{} // closed when the JVM has exited and was reaped
	waitErr error         // the JVM's exit status, valid after done is closed

	stopOnce sync.Once
	mu       sync.Mutex
	client   *dynamodb.Client
}

// Start starts a private DynamoDB Local for tb and stops it at tb's cleanup. It fails tb,
// with the JVM's log tail, when the instance does not answer within 60 seconds.
func Start(tb testing.TB) *Local {
	tb.Helper()
	begin := time.Now()
	l, err := start()
	if err != nil {
		tb.Fatalf("starting dynamodb local: %v", err)
	}
	tb.Cleanup(l.Stop)
	tb.Logf("dynamodb local on %s ready after %s", l.Endpoint, time.Since(begin).Round(time.Millisecond))
	return l
}

func start() (*Local, error) {
	dir, err := EnsureInstalled()
	if err != nil {
		return nil, err
	}
	java, err := exec.LookPath("java")
	if err != nil {
		return nil, fmt.Errorf("looking up java: %w", err)
	}
	for attempt := 1; ; attempt++ {
		l, err := launch(java, dir)
		if err == nil {
			return l, nil
		}
		if attempt >= startAttempts || !errors.Is(err, errPortTaken) {
			return nil, err
		}
	}
}

var errPortTaken = errors.New("dynamotest: port taken")

// launch starts the JVM on a free port and waits until it answers.
func launch(java, dir string) (*Local, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	l := &Local{
		Endpoint: "http://127.0.0.1:" + strconv.Itoa(port),
		Port:     port,
		Dir:      dir,
		log:      &syncbuf.Buffer{Max: logTailBytes},
		done:     make(chan struct{}),
	}
	args := append(append([]string{}, jvmOptions...),
		"-Djava.library.path="+filepath.Join(dir, "DynamoDBLocal_lib"),
		"-jar", filepath.Join(dir, "DynamoDBLocal.jar"),
		"-sharedDb", "-inMemory", "-port", strconv.Itoa(port))
	l.cmd = exec.Command(java, args...)
	l.cmd.Dir = dir
	l.cmd.Stdout = l.log
	l.cmd.Stderr = l.log
	l.cmd.SysProcAttr = sysProcAttr()

	// Start and Wait on one locked OS thread: the parent-death signal (Linux) fires when the
	// thread that forked the child exits, so that thread must live as long as the JVM. It
	// does: the goroutine stays locked to it, blocked in Wait, and the thread ends (and the
	// JVM with it) only when the JVM has exited or the whole test process goes away.
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := l.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		l.waitErr = l.cmd.Wait()
		close(l.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("starting %s: %w", java, err)
	}

	if err := l.waitReady(startTimeout); err != nil {
		l.Stop()
		if strings.Contains(l.log.String(), "Address already in use") {
			return nil, fmt.Errorf("%w: %d: %v", errPortTaken, port, err)
		}
		return nil, fmt.Errorf("%w\njvm log tail:\n%s", err, l.log.String())
	}
	return l, nil
}

// waitReady polls until the instance answers a ListTables call, the JVM exits, or timeout.
func (l *Local) waitReady(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	client, err := cloud.NewClient(ctx, cloud.Config{Endpoint: l.Endpoint, Region: region},
		cloud.WithRetryMaxAttempts(1))
	if err != nil {
		return fmt.Errorf("creating client: %w", err)
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for {
		select {
		case <-l.done:
			return fmt.Errorf("dynamodb local exited during startup: %v", l.waitErr)
		case <-ctx.Done():
			return fmt.Errorf("dynamodb local did not answer on %s within %s: %v", l.Endpoint, timeout, lastErr)
		case <-tick.C:
		}
		conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(l.Port)), time.Second)
		if err != nil {
			lastErr = err
			continue
		}
		_ = conn.Close()
		callCtx, callCancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = client.ListTables(callCtx, &dynamodb.ListTablesInput{Limit: aws.Int32(1)})
		callCancel()
		if err == nil {
			return nil
		}
		lastErr = err
	}
}

// Stop kills the JVM (its whole process group) and waits, at most 10 seconds, until it has
// exited. It is idempotent and safe to call on a paused instance.
func (l *Local) Stop() {
	l.stopOnce.Do(func() {
		select {
		case <-l.done:
			return
		default:
		}
		_ = syscall.Kill(-l.cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-l.done:
		case <-time.After(stopTimeout):
		}
	})
}

// Pause freezes the JVM with SIGSTOP: connections stay open, requests hang. It resumes the
// instance at tb's cleanup, so a failing test does not leave it frozen.
func (l *Local) Pause(tb testing.TB) {
	tb.Helper()
	if err := l.signal(syscall.SIGSTOP); err != nil {
		tb.Fatalf("pausing dynamodb local: %v", err)
	}
	tb.Cleanup(func() { _ = l.signal(syscall.SIGCONT) })
}

// Resume continues a paused JVM with SIGCONT. Resuming a running instance does nothing.
func (l *Local) Resume(tb testing.TB) {
	tb.Helper()
	if err := l.signal(syscall.SIGCONT); err != nil {
		tb.Fatalf("resuming dynamodb local: %v", err)
	}
}

func (l *Local) signal(sig syscall.Signal) error {
	select {
	case <-l.done:
		return fmt.Errorf("dynamodb local on %s has exited: %v", l.Endpoint, l.waitErr)
	default:
	}
	if err := syscall.Kill(-l.cmd.Process.Pid, sig); err != nil {
		return fmt.Errorf("signal %v to process group %d: %w", sig, l.cmd.Process.Pid, err)
	}
	return nil
}

// Client returns a client for the instance, made with cloud.NewClient (region us-east-1,
// credentials from the SDK chain or the "local" fallback). Without opts the same client is
// returned on every call.
func (l *Local) Client(tb testing.TB, opts ...func(*dynamodb.Options)) *dynamodb.Client {
	tb.Helper()
	if len(opts) == 0 {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.client != nil {
			return l.client
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := cloud.NewClient(ctx, cloud.Config{Endpoint: l.Endpoint, Region: region}, opts...)
	if err != nil {
		tb.Fatalf("dynamodb local client: %v", err)
	}
	if len(opts) == 0 {
		l.client = c
	}
	return c
}

// NewTables creates the four tables with cloud.CreateTables under a fresh random prefix
// ("t" + 12 hex digits + "_") and returns their names. The tables are deleted at tb's
// cleanup.
func (l *Local) NewTables(tb testing.TB) cloud.Tables {
	tb.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	tables := cloud.TableNames("t" + hex.EncodeToString(b) + "_")

	client := l.Client(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	logger := slog.New(slog.NewTextHandler(tb.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := cloud.CreateTables(ctx, client, tables, logger); err != nil {
		tb.Fatalf("creating tables: %v", err)
	}
	tb.Cleanup(func() {
		select {
		case <-l.done:
			return // the instance is gone, and its tables with it
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, name := range tables.All() {
			if _, err := client.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(name)}); err != nil {
				tb.Logf("deleting table %s: %v", name, err)
			}
		}
	})
	return tables
}

// shared is the package's instance behind Main and Shared.
var shared struct {
	mu     sync.Mutex
	inMain bool
	local  *Local
	err    error
}

// Main runs the package's tests with one shared DynamoDB Local, started on the first call
// to Shared (packages whose selected tests need none start none), stops it and exits with
// the tests' exit code. Call it from TestMain:
//
//	func TestMain(m *testing.M) { dynamotest.Main(m) }
func Main(m *testing.M) {
	shared.mu.Lock()
	shared.inMain = true
	shared.mu.Unlock()

	code := m.Run()

	shared.mu.Lock()
	if shared.local != nil {
		shared.local.Stop()
	}
	shared.mu.Unlock()
	os.Exit(code)
}

// Shared returns the package's shared instance, starting it on first use. The package's
// TestMain must call Main. Tests must not Stop it; Pause resumes it at the test's cleanup,
// but other tests hang while it is paused, so hang tests should use Start instead. A
// failed start fails this and every later caller without retrying.
func Shared(tb testing.TB) *Local {
	tb.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.inMain {
		tb.Fatal("dynamotest.Shared needs the package's TestMain to call dynamotest.Main")
	}
	if shared.local == nil && shared.err == nil {
		begin := time.Now()
		shared.local, shared.err = start()
		if shared.err == nil {
			tb.Logf("shared dynamodb local on %s ready after %s", shared.local.Endpoint,
				time.Since(begin).Round(time.Millisecond))
		}
	}
	if shared.err != nil {
		tb.Fatalf("starting shared dynamodb local: %v", shared.err)
	}
	return shared.local
}

// EnsureInstalled returns the DynamoDB Local directory ($DYNAMODB_LOCAL_DIR or
// <module root>/.cache/dynamodb-local), running deploy/local/dynamodb-local.sh install when
// the jar or java is missing.
func EnsureInstalled() (string, error) {
	dir := os.Getenv("DYNAMODB_LOCAL_DIR")
	root, rootErr := moduleRoot()
	if dir == "" {
		if rootErr != nil {
			return "", rootErr
		}
		dir = filepath.Join(root, ".cache", "dynamodb-local")
	}
	_, jarErr := os.Stat(filepath.Join(dir, "DynamoDBLocal.jar"))
	_, javaErr := exec.LookPath("java")
	if jarErr == nil && javaErr == nil {
		return dir, nil
	}
	if rootErr != nil {
		return "", fmt.Errorf("dynamodb local missing in %s and no install script: %w", dir, rootErr)
	}
	script := filepath.Join(root, "deploy", "local", "dynamodb-local.sh")
	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", script, "install")
	cmd.Env = append(os.Environ(), "DYNAMODB_LOCAL_DIR="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("running %s install: %w\n%s", script, err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "DynamoDBLocal.jar")); err != nil {
		return "", fmt.Errorf("after %s install: %w", script, err)
	}
	return dir, nil
}

// moduleRoot walks up from the working directory to the first directory with a go.mod.
func moduleRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding module root: %w", err)
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("finding module root: no go.mod above %s", wd)
		}
	}
}

// freePort returns a TCP port that was free on 127.0.0.1 a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if err := ln.Close(); err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	return port, nil
}
