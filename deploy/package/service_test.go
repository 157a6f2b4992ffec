package deploypackage_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/harness/proc"
	"greenhouse-gateway/harness/syncbuf"
	"greenhouse-gateway/internal/cloud"
)

const (
	unitPath = "/usr/lib/systemd/system/greenhouse-gateway.service"
	etcDir   = "/etc/greenhouse-gateway"
	// region is what the operator writes into gateway.yaml's aws_region.
	region = "us-east-1"
	// waitLimit bounds every wait for the gateway (start, delivery).
	waitLimit = 60 * time.Second
)

// testService installs the package into a scratch root and runs the
// installed gatewayd the way systemd runs the packaged unit, after the
// installation steps the README gives a new user, against DynamoDB Local:
//
//   - the unit file is parsed: ExecStart, User, Group, StateDirectory (with
//     its mode), LoadCredential, Environment (with the %d specifier),
//     EnvironmentFile, WatchdogSec and TimeoutStopSec are applied as systemd
//     applies them; the process starts with systemd's clean environment,
//     chrooted into the scratch root (so every path of the unit and of the
//     packaged gateway.yaml means what it means on the Pi) and as the
//     system user the postinst created;
//   - the credentials are the secrets the postinst made in the scratch
//     root, copied into /run/credentials/greenhouse-gateway.service;
//   - a notify socket stands in for systemd's: READY=1 and STOPPING=1 must
//     come from the main process (NotifyAccess=main);
//   - the operator edits only what the README says: aws_region (and here
//     dynamodb_endpoint and table_prefix) in gateway.yaml, the AWS
//     credentials in gateway.env, and, since the test needs free loopback
//     ports, GATEWAY_MQTT_ADDR and GATEWAY_HTTP_ADDR in gateway.env;
//   - the tables and a device key are made with the packaged gatewayctl.
//
// Not emulated: the sandbox settings, MemoryMax and UMask (they restrict
// the service; the unit test in systemd/ checks them with systemd-analyze).
func testService(t *testing.T, deb string) {
	root, dpkg := scratchRoot(t)
	dpkg("--install", deb)
	// The scratch root is the service's "/": world-searchable as a real
	// root, or its user could not reach anything in it.
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	in := func(abs string) string { return filepath.Join(root, abs) }
	unit := parseUnit(t, in(unitPath))

	db := dynamotest.Start(t)
	prefix := "gh" + strconv.Itoa(os.Getpid()) + "_"
	mqttAddr, httpAddr := freeAddr(t), freeAddr(t)

	// The operator's edits, as README's "Install on a Raspberry Pi" says.
	yamlPath := in(etcDir + "/gateway.yaml")
	setYAML(t, yamlPath, "aws_region", region)
	setYAML(t, yamlPath, "dynamodb_endpoint", db.Endpoint)
	setYAML(t, yamlPath, "table_prefix", prefix)
	appendFile(t, in(etcDir+"/gateway.env"), "AWS_ACCESS_KEY_ID=local\nAWS_SECRET_ACCESS_KEY=local\n"+
		"GATEWAY_MQTT_ADDR="+mqttAddr+"\nGATEWAY_HTTP_ADDR="+httpAddr+"\n")

	// The cloud side with the packaged gatewayctl, in the environment of
	// gateway.env (README: set -a; . /etc/greenhouse-gateway/gateway.env).
	ctl := in("/usr/bin/gatewayctl")
	ctlEnv := envFileVars(t, in(etcDir+"/gateway.env"))
	cloudFlags := []string{"--dynamodb-endpoint", db.Endpoint, "--aws-region", region, "--table-prefix", prefix}
	cmdClean(t, ctlEnv, ctl, append([]string{"tables", "create"}, cloudFlags...)...)
	key := strings.TrimSpace(cmdClean(t, ctlEnv, ctl, append([]string{"keys", "create",
		"--api-key-pepper-file", in(etcDir + "/api_key_pepper"), "--description", "greenhouse 3"}, cloudFlags...)...))
	if !regexp.MustCompile(`^\S{16,}$`).MatchString(key) {
		t.Fatalf("gatewayctl keys create printed %q, want one raw key", key)
	}
	adminToken := readFile(t, in(etcDir+"/admin_token"))

	svc := startUnit(t, root, unit)
	base := "http://" + httpAddr

	// READY=1 means the listeners are bound and the buffer open: ready at once.
	svc.expect(t, "READY=1")
	if resp, body := get(t, base+"/readyz", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /readyz after READY=1: %d %s", resp.StatusCode, body)
	}
	if status := svc.expect(t, "STATUS="); !strings.Contains(status, "http "+httpAddr) || !strings.Contains(status, "mqtt "+mqttAddr) {
		t.Errorf("status %q does not name the configured listeners %s and %s", status, mqttAddr, httpAddr)
	}
	svc.expect(t, "WATCHDOG=1") // WatchdogSec= is set: the first ping comes at start

	// The status page: any user name, the admin token as the password.
	resp, page := get(t, base+"/", "operator:"+adminToken)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET / with the admin token: %d %s\n%s", resp.StatusCode, resp.Header.Get("Content-Type"), page)
	}
	if !strings.Contains(page, "version "+version) {
		t.Errorf("the status page does not show version %s:\n%s", version, page)
	}
	if resp, _ := get(t, base+"/", ""); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET / without credentials: %d, want 401", resp.StatusCode)
	}

	// A device posts one batch with its key, as firmware-contract/README.md says.
	hw := "02:00:00:00:AB:01"
	const readings = 3
	body := batch(hw, readings)
	req, err := http.NewRequest(http.MethodPost, base+"/v1/readings", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, answer := do(t, req)
	if resp.StatusCode != http.StatusOK || !strings.Contains(answer, `"accepted":1`) {
		t.Fatalf("POST /v1/readings: %d %s", resp.StatusCode, answer)
	}

	// Delivered: the backlog is empty, the uplink up, the readings in DynamoDB.
	var up struct {
		State          string     `json:"state"`
		BacklogBatches int64      `json:"backlog_batches"`
		LastDeliveryAt *time.Time `json:"last_delivery_at"`
	}
	eventually(t, svc, "the batch to be delivered", func() bool {
		resp, b := get(t, base+"/v1/uplink", "bearer:"+adminToken)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /v1/uplink: %d %s", resp.StatusCode, b)
		}
		if err := json.Unmarshal([]byte(b), &up); err != nil {
			t.Fatalf("GET /v1/uplink: %v\n%s", err, b)
		}
		return up.State == "up" && up.BacklogBatches == 0 && up.LastDeliveryAt != nil
	})
	if n := countReadings(t, db, cloud.TableNames(prefix).Readings, hw); n != readings {
		t.Errorf("DynamoDB holds %d readings of %s, want %d", n, hw, readings)
	}
	_, page = get(t, base+"/", "operator:"+adminToken)
	for _, want := range []string{`<span class="badge ok">up</span>`, "<dd>0 batches, 0 B</dd>"} {
		if !strings.Contains(page, want) {
			t.Errorf("the status page after delivery lacks %q:\n%s", want, page)
		}
	}

	// gatewayctl status, as README's troubleshooting section runs it.
	status := cmdClean(t, nil, ctl, "status", "--url", base, "--admin-token-file", in(etcDir+"/admin_token"))
	if !strings.Contains(status, "gatewayd at "+base+": ready") || !strings.Contains(status, "devices: 1 known") {
		t.Errorf("gatewayctl status printed:\n%s", status)
	}

	// systemctl stop: SIGTERM, then SIGKILL after TimeoutStopSec.
	stopTimeout, err := time.ParseDuration(unit.one(t, "TimeoutStopSec"))
	if err != nil {
		t.Fatalf("TimeoutStopSec: %v", err)
	}
	if err := svc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-svc.exited:
		svc.exited <- err
		if err != nil {
			t.Errorf("gatewayd exited with %v after SIGTERM, want status 0", err)
		}
	case <-time.After(stopTimeout):
		t.Fatalf("gatewayd still runs %s (TimeoutStopSec) after SIGTERM; systemd would kill it", stopTimeout)
	}
	svc.expect(t, "STOPPING=1")

	// What it left: the buffer in the StateDirectory, owned by the
	// service user; no complaint about the environment it was given.
	state := in("/var/lib/" + unit.one(t, "StateDirectory"))
	if _, err := os.Stat(filepath.Join(state, "MANIFEST")); err != nil {
		t.Errorf("no buffer in the StateDirectory: %v", err)
	}
	if fi, err := os.Stat(state); err == nil {
		if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != svc.uid {
			t.Errorf("%s is owned by uid %d, want the service user's %d", state, st.Uid, svc.uid)
		}
	}
	logs := svc.logs.String()
	for _, want := range []string{"data_dir=/var/lib/greenhouse-gateway", "gatewayd stopped"} {
		if !strings.Contains(logs, want) {
			t.Errorf("gatewayd's log lacks %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "names no setting") {
		t.Errorf("gatewayd ignored part of the unit's environment:\n%s", logs)
	}
}

// unitFile is a parsed unit: its [Service] settings in order, by key.
type unitFile map[string][]string

// parseUnit reads the [Service] section of a unit file. Continuation lines
// and quoting are not supported: the packaged unit uses neither, and a
// unit that starts to is refused rather than misread.
func parseUnit(t testing.TB, path string) unitFile {
	t.Helper()
	u := unitFile{}
	section := ""
	for i, line := range strings.Split(readFile(t, path), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[':
			section = strings.Trim(line, "[]")
		case strings.HasSuffix(line, `\`) || strings.ContainsAny(line, `"'`):
			t.Fatalf("%s:%d: continuation or quoting, which this test does not parse: %q", path, i+1, line)
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("%s:%d: malformed line %q", path, i+1, line)
			}
			if section == "Service" {
				u[k] = append(u[k], v)
			}
		}
	}
	return u
}

func (u unitFile) one(t testing.TB, key string) string {
	t.Helper()
	if v := u[key]; len(v) == 1 {
		return v[0]
	}
	t.Fatalf("unit: %s has %d values %q, want one", key, len(u[key]), u[key])
	return ""
}

// expand replaces the specifiers the packaged unit uses (%d, the
// credentials directory, and %%); any other fails the test.
func expand(t testing.TB, s, credDir string) string {
	t.Helper()
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 == len(s) {
			t.Fatalf("unit: %q ends in %%", s)
		}
		i++
		switch s[i] {
		case 'd':
			b.WriteString(credDir)
		case '%':
			b.WriteByte('%')
		default:
			t.Fatalf("unit: specifier %%%c in %q is not emulated by this test", s[i], s)
		}
	}
	return b.String()
}

// service is gatewayd started as the unit.
type service struct {
	cmd    *exec.Cmd
	uid    int
	logs   *syncbuf.Buffer
	exited chan error
	notes  chan notification
}

// notification is one datagram on the notify socket and its sender.
type notification struct {
	pid  int32
	vars []string
}

// startUnit starts ExecStart of unit inside root as systemd would.
func startUnit(t *testing.T, root string, unit unitFile) *service {
	in := func(abs string) string { return filepath.Join(root, abs) }
	name := filepath.Base(unitPath)

	// User= and Group=, from the scratch root's passwd and group, where the
	// postinst's systemd-sysusers put them.
	user, group := unit.one(t, "User"), unit.one(t, "Group")
	uid, home := lookupPasswd(t, in("/etc/passwd"), user)
	gid := lookupGroup(t, in("/etc/group"), group)

	// StateDirectory=: /var/lib/NAME, owned by the user, StateDirectoryMode.
	stateDir := "/var/lib/" + unit.one(t, "StateDirectory")
	mode, err := strconv.ParseUint(unit.one(t, "StateDirectoryMode"), 8, 32)
	if err != nil {
		t.Fatalf("StateDirectoryMode: %v", err)
	}
	mkdirOwned(t, in(stateDir), os.FileMode(mode), uid, gid)

	// LoadCredential=ID:PATH: systemd reads PATH as root and puts a copy,
	// readable by the service user only, in the credentials directory.
	credDir := "/run/credentials/" + name
	mkdirOwned(t, in("/run"), 0o755, 0, 0)
	mkdirOwned(t, in("/run/credentials"), 0o755, 0, 0)
	mkdirOwned(t, in(credDir), 0o500, uid, gid)
	for _, c := range unit["LoadCredential"] {
		id, src, ok := strings.Cut(c, ":")
		if !ok || !filepath.IsAbs(src) || strings.Contains(id, "/") {
			t.Fatalf("LoadCredential=%s: want ID:/absolute/path", c)
		}
		b, err := os.ReadFile(in(src))
		if err != nil {
			t.Fatalf("LoadCredential=%s: %v (systemd would refuse to start the unit)", c, err)
		}
		dst := in(filepath.Join(credDir, id))
		if err := os.WriteFile(dst, b, 0o400); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(dst, uid, gid); err != nil {
			t.Fatal(err)
		}
	}

	// The notify socket, as systemd's: any process may connect; systemd
	// reads the sender's credentials to apply NotifyAccess=.
	if got := unit.one(t, "NotifyAccess"); got != "main" {
		t.Fatalf("NotifyAccess=%s: this test emulates main", got)
	}
	notifyPath := "/run/systemd/notify"
	mkdirOwned(t, in("/run/systemd"), 0o755, 0, 0)
	svc := &service{uid: uid, logs: &syncbuf.Buffer{}, exited: make(chan error, 1), notes: make(chan notification, 64)}
	listenNotify(t, in(notifyPath), svc.notes)

	// The environment: systemd's own variables, then Environment=, then
	// EnvironmentFile= (which wins). Nothing is inherited from this test.
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin",
		"HOME=" + home, "USER=" + user, "LOGNAME=" + user, "SHELL=/usr/sbin/nologin",
		"INVOCATION_ID=0123456789abcdef0123456789abcdef",
		"NOTIFY_SOCKET=" + notifyPath,
		"STATE_DIRECTORY=" + stateDir,
		"CREDENTIALS_DIRECTORY=" + credDir,
	}
	if wd := unit["WatchdogSec"]; len(wd) == 1 {
		d, err := time.ParseDuration(wd[0])
		if err != nil {
			t.Fatalf("WatchdogSec=%s: %v", wd[0], err)
		}
		env = append(env, "WATCHDOG_USEC="+strconv.FormatInt(d.Microseconds(), 10))
	}
	for _, e := range unit["Environment"] {
		for _, assignment := range strings.Fields(e) {
			if !strings.Contains(assignment, "=") {
				t.Fatalf("Environment=%s: %q is no assignment", e, assignment)
			}
			env = append(env, expand(t, assignment, credDir))
		}
	}
	for _, f := range unit["EnvironmentFile"] {
		path, optional := strings.CutPrefix(f, "-")
		if _, err := os.Stat(in(path)); err != nil && optional {
			continue
		}
		env = append(env, envFileVars(t, in(path))...)
	}

	// ExecStart=, chrooted into the scratch root, as the service user.
	argv := strings.Fields(unit.one(t, "ExecStart"))
	if len(argv) == 0 || !filepath.IsAbs(argv[0]) {
		t.Fatalf("ExecStart=%s: want an absolute path without prefixes", unit.one(t, "ExecStart"))
	}
	for _, a := range argv {
		if strings.Contains(a, "%") || strings.Contains(a, "$") {
			t.Fatalf("ExecStart=%s: specifiers and variables are not emulated by this test", unit.one(t, "ExecStart"))
		}
	}
	svc.cmd = &exec.Cmd{Path: argv[0], Args: argv, Env: env, Dir: "/", Stdout: svc.logs, Stderr: svc.logs}
	svc.cmd.SysProcAttr = &syscall.SysProcAttr{
		Chroot:     root,
		Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{uint32(gid)}},
		Setpgid:    true,
	}
	if err := svc.cmd.Start(); err != nil {
		t.Fatalf("starting %s in %s as %s: %v", argv[0], root, user, err)
	}
	go func() { svc.exited <- svc.cmd.Wait() }()
	t.Cleanup(func() {
		_ = svc.cmd.Process.Kill()
		err := <-svc.exited
		svc.exited <- err
		if t.Failed() {
			t.Logf("gatewayd's log:\n%s", svc.logs.String())
		}
	})
	return svc
}

// expect waits for the next notification that has an assignment starting
// with prefix, sent by the main process, and returns that assignment.
func (s *service) expect(t *testing.T, prefix string) string {
	t.Helper()
	deadline := time.After(waitLimit)
	exited := s.exited
	for {
		select {
		case n := <-s.notes:
			for _, v := range n.vars {
				if !strings.HasPrefix(v, prefix) {
					continue
				}
				if int(n.pid) != s.cmd.Process.Pid {
					t.Fatalf("%s came from pid %d, not the main process %d (NotifyAccess=main ignores it)", v, n.pid, s.cmd.Process.Pid)
				}
				return v
			}
		case err := <-exited:
			// What it sent before exiting may still be on its way from
			// the socket to this test: a short grace, then give up.
			s.exited <- err
			exited = nil
			deadline = time.After(5 * time.Second)
		case <-deadline:
			if exited == nil {
				t.Fatalf("gatewayd exited without sending %s", prefix)
			}
			t.Fatalf("no %s from gatewayd within %s", prefix, waitLimit)
		}
	}
}

// listenNotify binds a datagram socket at path that passes the sender's
// credentials, and forwards what arrives to notes until the test ends.
func listenNotify(t *testing.T, path string, notes chan<- notification) {
	t.Helper()
	if len(path) >= 108 {
		t.Skipf("skipping: the notify socket path %s is too long for AF_UNIX; use a shorter TMPDIR", path)
	}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := os.Chmod(path, 0o777); err != nil {
		t.Fatal(err)
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var soErr error
	if err := raw.Control(func(fd uintptr) {
		soErr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_PASSCRED, 1)
	}); err != nil || soErr != nil {
		t.Fatalf("SO_PASSCRED: %v %v", err, soErr)
	}
	go func() {
		buf := make([]byte, 4096)
		oob := make([]byte, syscall.CmsgSpace(syscall.SizeofUcred))
		for {
			n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
			if err != nil {
				return // closed at the end of the test
			}
			note := notification{pid: -1, vars: strings.Split(strings.TrimSpace(string(buf[:n])), "\n")}
			if msgs, err := syscall.ParseSocketControlMessage(oob[:oobn]); err == nil {
				for _, m := range msgs {
					if cred, err := syscall.ParseUnixCredentials(&m); err == nil {
						note.pid = cred.Pid
					}
				}
			}
			select {
			case notes <- note:
			default: // nobody reads any more
			}
		}
	}()
}

// eventually polls cond every 100 ms until it holds, failing after
// waitLimit or when gatewayd exits.
func eventually(t *testing.T, svc *service, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		select {
		case err := <-svc.exited:
			svc.exited <- err
			t.Fatalf("gatewayd exited (%v) while waiting for %s", err, what)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", waitLimit, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// get fetches url; auth is "" (none), "bearer:TOKEN" or "USER:PASSWORD"
// (HTTP Basic).
func get(t *testing.T, url, auth string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token, ok := strings.CutPrefix(auth, "bearer:"); ok {
		req.Header.Set("Authorization", "Bearer "+token)
	} else if user, pass, ok := strings.Cut(auth, ":"); ok {
		req.SetBasicAuth(user, pass)
	}
	return do(t, req)
}

var httpClient = &http.Client{Timeout: 10 * time.Second}

func do(t *testing.T, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", req.Method, req.URL, err)
	}
	return resp, string(b)
}

// batch is one readings batch of n readings of the last minutes.
func batch(hw string, n int) string {
	const boot = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
	end := time.Now().Add(-time.Minute).UnixMilli()
	var readings []string
	for k := range n {
		readings = append(readings, fmt.Sprintf(`{"timestamp_ms":%d,"sensors":{"bme280_temp_c":%.1f,"humidity_pct":45.2}}`,
			end-int64(n-1-k)*1000, 20+float64(k)/10))
	}
	start := end - int64(n)*1000
	return fmt.Sprintf(`{"batch_id":"%s_%s_%d_%d","hardware_id":"%s","boot_id":"%s","firmware_version":"1.0.16","readings":[%s]}`,
		hw, boot, start, end, hw, boot, strings.Join(readings, ","))
}

func countReadings(t *testing.T, db *dynamotest.Local, table, hw string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := db.Client(t).Query(ctx, &dynamodb.QueryInput{
		TableName:                 aws.String(table),
		KeyConditionExpression:    aws.String("hardware_id = :hw"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":hw": &types.AttributeValueMemberS{Value: hw}},
		ConsistentRead:            aws.Bool(true),
	})
	if err != nil {
		t.Fatalf("querying %s: %v", table, err)
	}
	return int(out.Count)
}

// envFileVars reads an EnvironmentFile=: VAR=value lines; blank lines and
// lines starting with # or ; are skipped. Quoting is refused (the packaged
// file documents "no shell syntax").
func envFileVars(t testing.TB, path string) []string {
	t.Helper()
	var vars []string
	sc := bufio.NewScanner(strings.NewReader(readFile(t, path)))
	for i := 1; sc.Scan(); i++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		k, _, ok := strings.Cut(line, "=")
		if !ok || k == "" || strings.ContainsAny(line, `"'\`) {
			t.Fatalf("%s:%d: %q is not a plain VAR=value line", path, i, line)
		}
		vars = append(vars, line)
	}
	return vars
}

// cmdClean runs name with exactly env (plus PATH), as a user's shell that
// sourced gateway.env would, and returns its stdout.
func cmdClean(t testing.TB, env []string, name string, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	c := exec.Command(name, args...)
	c.Stdout, c.Stderr = &stdout, &stderr
	c.Env = append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + t.TempDir()}, env...)
	if err := c.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// setYAML sets a top-level key of the packaged gateway.yaml, which must
// hold exactly one line for it, as an operator's editor would.
func setYAML(t testing.TB, path, key, value string) {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(key) + `: .*$`)
	b := []byte(readFile(t, path))
	if n := len(re.FindAll(b, -1)); n != 1 {
		t.Fatalf("%s has %d lines setting %s, want one", path, n, key)
	}
	b = re.ReplaceAllLiteral(b, []byte(key+": "+strconv.Quote(value)))
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func appendFile(t testing.TB, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(s); err != nil {
		f.Close()
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func mkdirOwned(t testing.TB, path string, mode os.FileMode, uid, gid int) {
	t.Helper()
	if err := os.MkdirAll(path, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, uid, gid); err != nil {
		t.Fatal(err)
	}
}

// lookupPasswd returns the uid and home directory of user in passwd.
func lookupPasswd(t testing.TB, passwd, user string) (int, string) {
	t.Helper()
	for _, line := range strings.Split(readFile(t, passwd), "\n") {
		f := strings.Split(line, ":")
		if len(f) == 7 && f[0] == user {
			uid, err := strconv.Atoi(f[2])
			if err != nil {
				t.Fatalf("%s: bad uid in %q", passwd, line)
			}
			return uid, f[5]
		}
	}
	t.Fatalf("User=%s is not in %s: the unit could not start", user, passwd)
	return 0, ""
}

func lookupGroup(t testing.TB, groupFile, group string) int {
	t.Helper()
	for _, line := range strings.Split(readFile(t, groupFile), "\n") {
		f := strings.Split(line, ":")
		if len(f) == 4 && f[0] == group {
			gid, err := strconv.Atoi(f[2])
			if err != nil {
				t.Fatalf("%s: bad gid in %q", groupFile, line)
			}
			return gid
		}
	}
	t.Fatalf("Group=%s is not in %s: the unit could not start", group, groupFile)
	return 0
}

func freeAddr(t testing.TB) string {
	t.Helper()
	addr, err := proc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}
