//go:build unix

package lambdatest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/lambda"

	"greenhouse-gateway/harness/invokeproxy"
	"greenhouse-gateway/harness/proc"
	"greenhouse-gateway/harness/syncbuf"
)

// FunctionName is the only function name the emulator serves.
const FunctionName = "function"

// Emulator is one Runtime Interface Emulator running a function binary,
// behind a proxy that passes one invoke at a time.
type Emulator struct {
	// Endpoint is the proxy's base URL: the SDK's BaseEndpoint.
	Endpoint string

	rie, bootstrap string
	env            []string
	riePort        int
	apiPort        int
	proxy          *http.Server
	output         *syncbuf.Buffer

	mu sync.Mutex
	p  *proc.Process
}

// Start runs bootstrap under a new emulator with env added to this
// process's environment, and stops it when the test ends.
func Start(tb testing.TB, bootstrap string, env map[string]string) *Emulator {
	tb.Helper()
	e, err := Launch(RIEPath(tb), bootstrap, env)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := e.Close(); err != nil {
			tb.Errorf("stopping the emulator: %v", err)
		}
	})
	return e
}

// Launch runs bootstrap under the emulator binary rie (BuildRIE) with
// overrides added to this process's environment, outside tests (make run);
// the caller Closes it.
func Launch(rie, bootstrap string, overrides map[string]string) (*Emulator, error) {
	e := &Emulator{rie: rie, bootstrap: bootstrap, env: env(overrides), output: &syncbuf.Buffer{Max: 1 << 20}}
	var err error
	if e.riePort, err = proc.FreePort(); err != nil {
		return nil, err
	}
	if e.apiPort, err = proc.FreePort(); err != nil {
		return nil, err
	}
	target, _ := url.Parse("http://127.0.0.1:" + strconv.Itoa(e.riePort))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening for the emulator's proxy: %w", err)
	}
	e.Endpoint = "http://" + l.Addr().String()
	// invokeproxy holds the next invoke until the emulator answered the one
	// before, even when that one's caller went away (the emulator still runs
	// it, and crashes on a second).
	serial, err := invokeproxy.New([]string{target.String()}, 0, nil)
	if err != nil {
		return nil, err
	}
	e.proxy = &http.Server{Handler: serial.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = e.proxy.Serve(l) }()
	if err := e.Restart(); err != nil {
		_ = e.proxy.Close()
		return nil, err
	}
	return e, nil
}

// Restart starts the emulator again on its ports after Kill (or kills the
// running one first).
func (e *Emulator) Restart() error {
	e.Kill()
	cmd := exec.Command(e.rie,
		"--runtime-interface-emulator-address", "127.0.0.1:"+strconv.Itoa(e.riePort),
		"--runtime-api-address", "127.0.0.1:"+strconv.Itoa(e.apiPort),
		e.bootstrap)
	cmd.Env = e.env
	cmd.Stdout, cmd.Stderr = e.output, e.output
	p, err := proc.Start("aws-lambda-rie", cmd)
	if err != nil {
		return fmt.Errorf("starting the emulator: %w", err)
	}
	e.mu.Lock()
	e.p = p
	e.mu.Unlock()
	deadline := time.Now().Add(startTimeout)
	for {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(e.riePort), time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if p.Exited() || time.Now().After(deadline) {
			e.Kill()
			return fmt.Errorf("the emulator did not listen on 127.0.0.1:%d: %w\n%s", e.riePort, err, e.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill kills the emulator and the function process with SIGKILL (its
// process group), as a crash would, and waits for it.
func (e *Emulator) Kill() {
	e.mu.Lock()
	p := e.p
	e.p = nil
	e.mu.Unlock()
	if p != nil {
		// The emulator starts the function in a process group of its own:
		// kill both groups, the function's first.
		for _, child := range children(p.Pid()) {
			_ = syscall.Kill(-child, syscall.SIGKILL)
			_ = syscall.Kill(child, syscall.SIGKILL)
		}
		_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
		_ = p.Kill()
	}
}

// Close kills the emulator and stops the proxy.
func (e *Emulator) Close() error {
	e.Kill()
	return e.proxy.Close()
}

// Output returns what the emulator and the function wrote so far.
func (e *Emulator) Output() string { return e.output.String() }

// Client returns a Lambda client of the emulator (through the proxy),
// without retries: the caller owns them.
func (e *Emulator) Client() *lambda.Client {
	return lambda.New(lambda.Options{
		Region:           "us-east-1",
		BaseEndpoint:     aws.String(e.Endpoint),
		Credentials:      credentials.NewStaticCredentialsProvider("local", "local", ""),
		HTTPClient:       awshttp.NewBuildableClient(),
		RetryMaxAttempts: 1,
	})
}

// ErrFunction is an invocation the function answered with an error.
var ErrFunction = errors.New("the function returned an error")

// Invoke invokes the function with payload and returns its answer.
func (e *Emulator) Invoke(ctx context.Context, payload []byte) ([]byte, error) {
	out, err := e.Client().Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String(FunctionName), Payload: payload})
	if err != nil {
		return nil, fmt.Errorf("invoking the function: %w", err)
	}
	if out.FunctionError != nil {
		return out.Payload, fmt.Errorf("%w (%s): %s", ErrFunction, aws.ToString(out.FunctionError), out.Payload)
	}
	return out.Payload, nil
}

// children returns the pids of pid's child processes (from /proc; none
// where there is no /proc).
func children(pid int) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var out []int
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read after ')'.
		end := bytes.LastIndexByte(b, ')')
		if end < 0 {
			continue
		}
		fields := strings.Fields(string(b[end+1:]))
		if len(fields) < 2 || fields[1] != strconv.Itoa(pid) {
			continue
		}
		if child, err := strconv.Atoi(filepath.Base(filepath.Dir(path))); err == nil {
			out = append(out, child)
		}
	}
	return out
}
