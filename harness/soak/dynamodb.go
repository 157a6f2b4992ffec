package soak

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"greenhouse-gateway/internal/cloud"

	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/harness/proc"
)

// DynamoDB Local settings.
const (
	// dynamoStartTimeout bounds the wait for a (re)started JVM to answer.
	dynamoStartTimeout = 90 * time.Second
)

// dynamoJVMOptions keep the JVM small and quick to start, as
// harness/dynamotest does.
var dynamoJVMOptions = []string{
	"-Xms16m", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData",
}

// dynamoLocal is one DynamoDB Local (1.11.478) that keeps its data on disk
// (-dbPath, with -sharedDb: one database whatever the credentials and
// region), so that it can be killed and restarted without losing what it
// acknowledged, on a port that stays the same across restarts. Unlike
// harness/dynamotest's in-memory instances, it is meant to be disturbed.
type dynamoLocal struct {
	install  string // DynamoDBLocal.jar and DynamoDBLocal_lib
	dbPath   string
	port     int
	endpoint string
	logPath  string
	proc     *proc.Process
	paused   bool
	starts   int
}

// newDynamoLocal prepares an instance whose database is in dbPath and whose
// log goes to dir.
func newDynamoLocal(dir, dbPath string) (*dynamoLocal, error) {
	install, err := dynamotest.EnsureInstalled()
	if err != nil {
		return nil, err
	}
	port, err := pickPort()
	if err != nil {
		return nil, err
	}
	d := &dynamoLocal{
		install:  install,
		dbPath:   dbPath,
		port:     port,
		endpoint: "http://127.0.0.1:" + strconv.Itoa(port),
		logPath:  filepath.Join(dir, "dynamodb-local.log"),
	}
	if err := os.MkdirAll(d.dbPath, 0o750); err != nil {
		return nil, fmt.Errorf("creating %s: %w", d.dbPath, err)
	}
	return d, nil
}

// start launches the JVM and waits until it answers ListTables.
func (d *dynamoLocal) start(ctx context.Context) error {
	java, err := exec.LookPath("java")
	if err != nil {
		return fmt.Errorf("looking up java: %w", err)
	}
	logFile, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("opening %s: %w", d.logPath, err)
	}
	defer logFile.Close() // the child has its own descriptor
	d.starts++
	fmt.Fprintf(logFile, "\n=== soak: start %d at %s\n", d.starts, time.Now().Format(time.RFC3339Nano))
	args := append(append([]string{}, dynamoJVMOptions...),
		"-Djava.library.path="+filepath.Join(d.install, "DynamoDBLocal_lib"),
		"-jar", filepath.Join(d.install, "DynamoDBLocal.jar"),
		"-sharedDb", "-dbPath", d.dbPath, "-port", strconv.Itoa(d.port))
	cmd := exec.Command(java, args...)
	cmd.Dir = d.install
	cmd.Stdout, cmd.Stderr = logFile, logFile
	d.proc, err = proc.Start("dynamodb-local", cmd)
	if err != nil {
		return err
	}
	d.paused = false
	if err := d.waitReady(ctx); err != nil {
		_ = d.proc.Kill()
		return fmt.Errorf("%w\n%s", err, tail(d.logPath, 2048))
	}
	return nil
}

func (d *dynamoLocal) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, dynamoStartTimeout)
	defer cancel()
	client, err := cloud.NewClient(ctx, cloud.Config{Endpoint: d.endpoint, Region: "us-east-1"}, cloud.WithRetryMaxAttempts(1))
	if err != nil {
		return fmt.Errorf("creating a client: %w", err)
	}
	var lastErr error
	for {
		if d.proc.Exited() {
			return fmt.Errorf("dynamodb local exited during startup: %s", d.proc.ExitDescription())
		}
		if conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(d.port), time.Second); err == nil {
			_ = conn.Close()
			cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
			_, err = client.ListTables(cctx, &dynamodb.ListTablesInput{Limit: aws.Int32(1)})
			ccancel()
			if err == nil {
				return nil
			}
			lastErr = err
		} else {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("dynamodb local did not answer on %s within %s: %v", d.endpoint, dynamoStartTimeout, lastErr)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// kill kills the JVM with SIGKILL (kill -9): what it acknowledged is in its
// database file.
func (d *dynamoLocal) kill() error {
	if d.proc == nil {
		return nil
	}
	d.paused = false
	return d.proc.Kill()
}

// pause stops the JVM with SIGSTOP: connections stay open, requests hang.
func (d *dynamoLocal) pause() error {
	if err := d.proc.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	d.paused = true
	return nil
}

// resume continues a paused JVM with SIGCONT.
func (d *dynamoLocal) resume() error {
	if !d.paused {
		return nil
	}
	if err := d.proc.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	d.paused = false
	return nil
}

// ensureRunning resumes a paused JVM and restarts a dead one.
func (d *dynamoLocal) ensureRunning(ctx context.Context) error {
	if d.proc != nil && !d.proc.Exited() {
		return d.resume()
	}
	return d.start(ctx)
}

// dynamoDBPath returns a new directory for a DynamoDB Local database: on
// tmpfs (/dev/shm) when there is one, else under dir. The database must
// survive the JVM's kill -9, not a power cut, and on a disk the SQLite
// fsyncs behind every write cap DynamoDB Local near 100 writes a second,
// slower than the gateway forwards.
func dynamoDBPath(dir string) (string, error) {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if p, err := os.MkdirTemp("/dev/shm", "soak-dynamodb-"); err == nil {
			return p, nil
		}
	}
	p := filepath.Join(dir, "dynamodb")
	return p, os.MkdirAll(p, 0o750)
}
