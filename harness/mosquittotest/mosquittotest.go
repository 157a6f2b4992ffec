//go:build unix

// Package mosquittotest runs Debian's mosquitto broker for integration tests of the
// gateway's external broker mode, and wraps mosquitto_pub and mosquitto_sub so tests can
// publish and subscribe as clients independent of the code under test.
//
//	b := mosquittotest.Start(t) // a private broker on a free 127.0.0.1 port
//	err := mosquittotest.Pub(t, b.URL(), "devices/AA:BB:CC:DD:EE:01/readings", 1, payload, "", "")
//
// Each broker listens on 127.0.0.1 only, never on 1883, allows anonymous clients and keeps
// its persistence file and log in the test's temporary directory: Restart keeps sessions,
// subscriptions and queued QoS 1 messages, as a production broker with persistence does.
// Debian's package may also start a system-wide mosquitto on 1883 when it is installed;
// nothing here uses it.
//
// When /usr/sbin/mosquitto, mosquitto_pub or mosquitto_sub is missing, the first Start (or
// Pub, or Sub) installs the Debian packages mosquitto and mosquitto-clients with apt-get
// (as root; otherwise it fails the test and says what to install). Test binaries of several
// packages may do this at once: they take turns on the lock file
// /tmp/greenhouse-gateway-apt.lock.
//
// Lifetime: the broker runs in its own process group. Start registers Stop with tb.Cleanup
// (SIGTERM, then SIGKILL after 5 seconds). On Linux the broker is also started with
// PR_SET_PDEATHSIG=SIGKILL, so it does not outlive a test process that dies without
// running its cleanups.
package mosquittotest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
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

	"greenhouse-gateway/harness/debpkg"
	"greenhouse-gateway/harness/proc"
	"greenhouse-gateway/harness/syncbuf"
)

const (
	// brokerPath is where Debian's mosquitto package installs the broker.
	brokerPath = "/usr/sbin/mosquitto"
	// startTimeout bounds the wait for a started broker to accept connections.
	startTimeout = 10 * time.Second
	// stopTimeout bounds each of the waits after SIGTERM and after SIGKILL.
	stopTimeout = 5 * time.Second
	// startAttempts is how often Start picks a new port when the broker cannot bind its
	// port (another process took it between our check and the broker's bind).
	startAttempts = 3
	// clientTimeout bounds one mosquitto_pub run, and is the -W of Sub's readiness wait.
	clientTimeout = 10 * time.Second
	// subLifetime is the -W of a Sub process: it exits by itself after this long.
	subLifetime = 120 * time.Second
	// tailBytes is how much broker output and log is kept for error messages.
	tailBytes = 8 << 10
)

// Broker is one mosquitto process on a fixed 127.0.0.1 port. Its methods are safe for
// concurrent use.
type Broker struct {
	port int
	dir  string // configuration, persistence file and log

	mu   sync.Mutex
	proc *proc.Process // the current run; nil while stopped
}

// Start starts a private broker for tb and stops it at tb's cleanup. It fails tb, with the
// broker's log, when the broker does not accept connections within 10 seconds.
func Start(tb testing.TB) *Broker {
	tb.Helper()
	if err := ensureInstalled(); err != nil {
		tb.Fatalf("mosquittotest: %v", err)
	}
	b := &Broker{dir: tb.TempDir()}
	tb.Cleanup(func() {
		b.stop()
		if tb.Failed() {
			tb.Logf("mosquitto log (%s):\n%s", b.logPath(), b.logTail())
		}
	})
	begin := time.Now()
	for attempt := 1; ; attempt++ {
		port, err := proc.FreePort()
		if err != nil {
			tb.Fatalf("mosquittotest: %v", err)
		}
		b.port = port
		err = b.launch()
		if err == nil {
			break
		}
		if attempt >= startAttempts || !errors.Is(err, errPortTaken) {
			tb.Fatalf("mosquittotest: %v", err)
		}
	}
	tb.Logf("mosquitto on %s ready after %s", b.Addr(), time.Since(begin).Round(time.Millisecond))
	return b
}

// Addr returns the broker's address, 127.0.0.1:PORT.
func (b *Broker) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

// URL returns the broker's address as a client URL, tcp://127.0.0.1:PORT.
func (b *Broker) URL() string { return "tcp://" + b.Addr() }

// Dir returns the directory of the broker's configuration (mosquitto.conf), persistence
// file (mosquitto.db) and log (mosquitto.log).
func (b *Broker) Dir() string { return b.dir }

// Stop stops the broker: SIGTERM, which makes mosquitto save its persistence file, then
// SIGKILL if it has not exited within 5 seconds. Stopping a stopped broker does nothing.
func (b *Broker) Stop(tb testing.TB) {
	tb.Helper()
	if err := b.stop(); err != nil {
		tb.Fatalf("mosquittotest: %v", err)
	}
}

// Restart stops the broker (as Stop) and starts it again on the same port with the same
// configuration and persistence file, so sessions, subscriptions and queued messages
// survive. It fails tb when the new process does not accept connections within 10 seconds.
func (b *Broker) Restart(tb testing.TB) {
	tb.Helper()
	if err := b.stop(); err != nil {
		tb.Fatalf("mosquittotest: %v", err)
	}
	if err := b.launch(); err != nil {
		tb.Fatalf("mosquittotest: restarting: %v", err)
	}
}

// Log returns the end of the broker's log file.
func (b *Broker) Log() string { return b.logTail() }

func (b *Broker) confPath() string { return filepath.Join(b.dir, "mosquitto.conf") }
func (b *Broker) logPath() string  { return filepath.Join(b.dir, "mosquitto.log") }

func (b *Broker) config() string {
	var c strings.Builder
	fmt.Fprintf(&c, "# written by greenhouse-gateway's mosquittotest\n")
	fmt.Fprintf(&c, "listener %d 127.0.0.1\n", b.port)
	fmt.Fprintf(&c, "allow_anonymous true\n")
	fmt.Fprintf(&c, "persistence true\n")
	fmt.Fprintf(&c, "persistence_location %s/\n", b.dir)
	fmt.Fprintf(&c, "persistence_file mosquitto.db\n")
	// Saved on every SIGTERM anyway; the short interval also covers a SIGKILL.
	fmt.Fprintf(&c, "autosave_interval 1\n")
	fmt.Fprintf(&c, "log_dest file %s\n", b.logPath())
	fmt.Fprintf(&c, "log_type error\nlog_type warning\nlog_type notice\nlog_type information\n")
	fmt.Fprintf(&c, "log_type subscribe\nlog_type unsubscribe\n")
	fmt.Fprintf(&c, "connection_messages true\n")
	fmt.Fprintf(&c, "log_timestamp_format %%Y-%%m-%%dT%%H:%%M:%%S\n")
	if os.Geteuid() == 0 {
		// mosquitto started as root switches to the user "mosquitto", which could not
		// write to the test's temporary directory.
		fmt.Fprintf(&c, "user root\n")
	}
	return c.String()
}

var errPortTaken = errors.New("port taken")

// launch writes the configuration, starts the broker and waits until it accepts
// connections.
func (b *Broker) launch() error {
	if err := os.WriteFile(b.confPath(), []byte(b.config()), 0o600); err != nil {
		return fmt.Errorf("writing the configuration: %w", err)
	}
	output := &syncbuf.Buffer{Max: tailBytes}
	cmd := exec.Command(brokerPath, "-c", b.confPath())
	cmd.Dir = b.dir
	cmd.Stdout = output
	cmd.Stderr = output
	p, err := proc.Start("mosquitto", cmd)
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.proc = p
	b.mu.Unlock()

	if err := p.WaitTCP(b.Addr(), startTimeout); err != nil {
		_ = b.stop()
		out := output.String() + b.logTail()
		if strings.Contains(out, "Address already in use") {
			return fmt.Errorf("%w: %d: %v", errPortTaken, b.port, err)
		}
		return fmt.Errorf("%w\nmosquitto output:\n%s", err, out)
	}
	return nil
}

// stop ends the current process, if any: SIGTERM to its group, then SIGKILL.
func (b *Broker) stop() error {
	b.mu.Lock()
	p := b.proc
	b.proc = nil
	b.mu.Unlock()
	if p == nil {
		return nil
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		if p.Exited() {
			return nil
		}
		_ = p.Signal(sig)
		if p.Wait(stopTimeout) {
			return nil
		}
	}
	return fmt.Errorf("mosquitto (pid %d) did not exit after SIGKILL within %s", p.Pid(), stopTimeout)
}

func (b *Broker) logTail() string {
	data, err := os.ReadFile(b.logPath())
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(data) > tailBytes {
		data = data[len(data)-tailBytes:]
	}
	return string(data)
}

// Pub publishes one message with mosquitto_pub, a client of its own, and returns when
// mosquitto_pub has exited: at QoS 1 and 2 after the broker acknowledged the message. url
// is tcp://HOST:PORT (or mqtt://); user and pass may be empty. The run is bounded to 10
// seconds; its output is part of the error. extra are more mosquitto_pub options, such as
// "-i", CLIENT_ID.
func Pub(tb testing.TB, url, topic string, qos int, payload []byte, user, pass string, extra ...string) error {
	tb.Helper()
	if err := ensureInstalled(); err != nil {
		tb.Fatalf("mosquittotest: %v", err)
	}
	args, err := clientArgs(url, user, pass)
	if err != nil {
		return err
	}
	// -s reads the whole of stdin as the one message: any bytes, newlines included.
	args = append(append(args, extra...), "-t", topic, "-q", strconv.Itoa(qos), "-s")
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "mosquitto_pub", args...)
	cmd.Stdin = bytes.NewReader(payload)
	cmd.WaitDelay = time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (no answer within %s)", err, clientTimeout)
		}
		return fmt.Errorf("mosquitto_pub to %s on %s: %w: %s", url, topic, err, bytes.TrimSpace(out))
	}
	return nil
}

// Message is one message a Subscription received.
type Message struct {
	Topic   string
	Payload []byte
}

// Subscription is a running mosquitto_sub, in its own process group like the broker. It
// exits by itself after 120 seconds (-W) and is killed at the test's cleanup.
type Subscription struct {
	proc     *proc.Process
	messages chan Message
	done     chan struct{} // closed when mosquitto_sub has exited and its output is read
	stderr   *syncbuf.Buffer
}

// Sub starts mosquitto_sub on topic (wildcards allowed) and returns once the broker has
// acknowledged the subscription, so that every message published after Sub returns is
// received. The session is clean; user and pass may be empty. It runs mosquitto_sub under
// coreutils' stdbuf, which makes its output line-buffered. extra are more mosquitto_sub
// options, such as "-i", CLIENT_ID.
func Sub(tb testing.TB, url, topic string, qos int, user, pass string, extra ...string) (*Subscription, error) {
	tb.Helper()
	if err := ensureInstalled(); err != nil {
		tb.Fatalf("mosquittotest: %v", err)
	}
	args, err := clientArgs(url, user, pass)
	if err != nil {
		return nil, err
	}
	// -d prints "Subscribed (mid: 1): ..." on SUBACK; messages are printed as one line
	// each, "=msg TOPIC HEXPAYLOAD", which no debug line starts with. mosquitto_sub's
	// stdout is a pipe, which stdio buffers fully: stdbuf -oL makes it line-buffered.
	args = append(append([]string{"-oL", "mosquitto_sub"}, args...), extra...)
	args = append(args, "-t", topic, "-q", strconv.Itoa(qos), "-d",
		"-W", strconv.Itoa(int(subLifetime/time.Second)), "-F", "=msg %t %x")
	s, stdout, err := startSub(args)
	if err != nil {
		return nil, err
	}
	tb.Cleanup(s.Close)
	subscribed := make(chan struct{})
	go s.read(stdout, subscribed)
	select {
	case <-subscribed:
		return s, nil
	case <-s.done:
		return nil, fmt.Errorf("mosquitto_sub on %s exited before subscribing: %v: %s", url, s.proc.Err(), s.stderr.String())
	case <-time.After(clientTimeout):
		s.Close()
		return nil, fmt.Errorf("mosquitto_sub on %s: no SUBACK within %s: %s", url, clientTimeout, s.stderr.String())
	}
}

// startSub starts stdbuf with args and returns the read end of its stdout. The output goes
// through an os.Pipe rather than cmd.StdoutPipe: proc.Start waits for the process on its
// own, and cmd.Wait closes a StdoutPipe's reader, which could drop output not yet read.
func startSub(args []string) (*Subscription, *os.File, error) {
	stdout, w, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("mosquitto_sub: %w", err)
	}
	s := &Subscription{
		messages: make(chan Message, 1024),
		done:     make(chan struct{}),
		stderr:   &syncbuf.Buffer{Max: tailBytes},
	}
	cmd := exec.Command("stdbuf", args...)
	cmd.Stdout = w
	cmd.Stderr = s.stderr
	s.proc, err = proc.Start("mosquitto_sub", cmd)
	_ = w.Close() // the child holds its own copy: EOF comes when it exits
	if err != nil {
		_ = stdout.Close()
		return nil, nil, err
	}
	return s, stdout, nil
}

func (s *Subscription) read(stdout io.ReadCloser, subscribed chan struct{}) {
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	once := sync.Once{}
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "Subscribed (mid:") {
			once.Do(func() { close(subscribed) })
			continue
		}
		rest, ok := strings.CutPrefix(line, "=msg ")
		if !ok {
			continue // a debug line
		}
		topic, hexPayload, _ := strings.Cut(rest, " ")
		payload, err := hex.DecodeString(hexPayload)
		if err != nil {
			continue
		}
		select {
		case s.messages <- Message{Topic: topic, Payload: payload}:
		default: // nobody reads: drop rather than block mosquitto_sub
		}
	}
	_ = stdout.Close()
	<-s.proc.Done()
	close(s.done)
}

// Next returns the next message, or an error when none arrives within timeout or
// mosquitto_sub has exited.
func (s *Subscription) Next(timeout time.Duration) (Message, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case m := <-s.messages:
		return m, nil
	case <-s.done:
		select {
		case m := <-s.messages:
			return m, nil
		default:
		}
		return Message{}, fmt.Errorf("mosquitto_sub has exited: %v: %s", s.proc.Err(), s.stderr.String())
	case <-timer.C:
		return Message{}, fmt.Errorf("no message within %s", timeout)
	}
}

// Close kills mosquitto_sub and waits, at most 5 seconds, until it has exited. It is
// idempotent.
func (s *Subscription) Close() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.proc.Signal(syscall.SIGKILL)
	select {
	case <-s.done:
	case <-time.After(stopTimeout):
	}
}

// clientArgs turns a broker URL and credentials into mosquitto_pub/mosquitto_sub options.
func clientArgs(rawURL, user, pass string) ([]string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("broker URL %q: %w", rawURL, err)
	}
	if u.Scheme != "tcp" && u.Scheme != "mqtt" {
		return nil, fmt.Errorf("broker URL %q: only tcp:// and mqtt:// are supported here", rawURL)
	}
	host, port := u.Hostname(), u.Port()
	if host == "" || port == "" {
		return nil, fmt.Errorf("broker URL %q: want tcp://HOST:PORT", rawURL)
	}
	args := []string{"-h", host, "-p", port, "-V", "mqttv311"}
	if user != "" {
		args = append(args, "-u", user)
	}
	if pass != "" {
		args = append(args, "-P", pass)
	}
	return args, nil
}

// ensureInstalled installs mosquitto and mosquitto-clients with apt-get when one of the
// programs is missing. The first failure is remembered: later calls fail at once.
func ensureInstalled() error {
	if installed() {
		return nil
	}
	install.Do(func() { install.err = runInstall() })
	return install.err
}

var install struct {
	sync.Once
	err error
}

func installed() bool {
	if _, err := os.Stat(brokerPath); err != nil {
		return false
	}
	for _, prog := range []string{"mosquitto_pub", "mosquitto_sub"} {
		if _, err := exec.LookPath(prog); err != nil {
			return false
		}
	}
	return true
}

func runInstall() error {
	ctx, cancel := context.WithTimeout(context.Background(), debpkg.Timeout)
	defer cancel()
	return debpkg.Install(ctx, installed, "mosquitto", "mosquitto-clients")
}
