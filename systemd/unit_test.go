// Package systemd_test checks the files of this directory: the unit
// greenhouse-gateway.service (systemd-analyze verify, and its exposure
// score with systemd-analyze security --offline=yes), the sysusers.d file
// (applied with systemd-sysusers to a scratch root), and that the unit, the
// default gateway.yaml and the environment file agree with each other.
//
// systemd-analyze comes from Debian's systemd package; when it is missing
// and the test runs as root with apt-get, the package is installed. No
// running systemd is needed: every check works on files. With -short only
// the consistency checks run (no subprocesses).
package systemd_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

const (
	unitFile     = "greenhouse-gateway.service"
	sysusersFile = "greenhouse-gateway.sysusers"
	configFile   = "gateway.yaml"
	envFile      = "gateway.env"
	serviceUser  = "greenhouse-gateway"

	// maxExposure bounds systemd-analyze security's overall exposure level
	// (0 best, 10 worst). Measured with systemd 252: 1.2 ("OK"). The
	// margin absorbs scoring changes between systemd versions; losing a
	// hardening setting is caught item by item by acceptedExposures.
	maxExposure = 1.5
)

// acceptedExposures are the security checks the unit deliberately fails,
// by systemd-analyze's json_field; every other check must pass.
var acceptedExposures = map[string]string{
	"PrivateNetwork":                        "devices and DynamoDB are reached over the host's network",
	"IPAddressDeny":                         "devices on any LAN address, DynamoDB on any AWS address",
	"RestrictAddressFamilies_AF_INET_INET6": "MQTT and HTTP listeners, DynamoDB client",
	"RestrictAddressFamilies_AF_UNIX":       "the sd_notify socket",
	"RootDirectoryOrRootImage":              "a plain Debian package, no image",
	"PrivateUsers":                          "user namespaces are not enabled on every Raspberry Pi kernel; the unit must start everywhere",
	"ProcSubset":                            "the Prometheus process collector reads /proc/stat (boot time); ProcSubset=pid would make /metrics fail",
	"DeviceAllow":                           "char-rtc:r, granted by ProtectClock=",
}

var (
	analyzeOnce sync.Once
	analyzePath string
	analyzeErr  error
)

// systemdAnalyze returns the path of systemd-analyze, installing Debian's
// systemd package with apt-get when it is missing and the test runs as
// root, or skips the test saying why it cannot run.
func systemdAnalyze(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping: runs systemd-analyze (-short)")
	}
	analyzeOnce.Do(func() {
		if p, err := exec.LookPath("systemd-analyze"); err == nil {
			analyzePath = p
			return
		}
		if os.Geteuid() != 0 {
			analyzeErr = errors.New("systemd-analyze is not installed and installing Debian's systemd package needs root")
			return
		}
		if _, err := exec.LookPath("apt-get"); err != nil {
			analyzeErr = errors.New("systemd-analyze is not installed and there is no apt-get to install Debian's systemd package")
			return
		}
		for _, args := range [][]string{
			{"update"},
			{"install", "-y", "--no-install-recommends", "systemd"},
		} {
			cmd := exec.Command("apt-get", args...)
			cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
			if out, err := cmd.CombinedOutput(); err != nil {
				analyzeErr = fmt.Errorf("installing Debian's systemd package: apt-get %s: %v\n%s",
					strings.Join(args, " "), err, tail(out, 2000))
				return
			}
		}
		analyzePath, analyzeErr = exec.LookPath("systemd-analyze")
	})
	if analyzeErr != nil {
		t.Skipf("skipping: systemd-analyze cannot run here: %v", analyzeErr)
	}
	return analyzePath
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// run runs a command and returns its stdout and stderr.
func run(t testing.TB, name string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var o, e bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &o, &e
	// No pager, no colours, no attempt to talk to a (missing) manager.
	cmd.Env = append(os.Environ(), "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0", "SYSTEMD_LOG_COLOR=0")
	err = cmd.Run()
	return o.String(), e.String(), err
}

// scratchRoot builds a file system root for systemd-analyze verify --root:
// this host's unit directory (so the unit's default dependencies resolve),
// the unit under test, and an executable at ExecStart's path, which verify
// checks.
func scratchRoot(t testing.TB) string {
	t.Helper()
	root := t.TempDir()
	hostUnits := "/usr/lib/systemd/system"
	if _, err := os.Stat(filepath.Join(hostUnits, "sysinit.target")); err != nil {
		hostUnits = "/lib/systemd/system"
	}
	units := filepath.Join(root, "usr/lib/systemd/system")
	if err := os.MkdirAll(units, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := copyDir(hostUnits, units); err != nil {
		t.Fatalf("copying the host's units: %v", err)
	}
	copyFile(t, unitFile, filepath.Join(units, unitFile), 0o644)
	bin := filepath.Join(root, "usr/bin/gatewayd")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

// copyDir copies regular files and symlinks of src into dst.
func copyDir(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(link, target)
		case d.Type().IsRegular():
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return os.WriteFile(target, b, 0o644)
		}
		return nil
	})
}

func copyFile(t testing.TB, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
}

func TestVerify(t *testing.T) {
	analyze := systemdAnalyze(t)
	root := scratchRoot(t)
	stdout, stderr, err := run(t, analyze, "verify", "--man=no", "--root="+root, unitFile)
	if err != nil || strings.TrimSpace(stdout+stderr) != "" {
		// verify exits 0 on unknown keys and bad values, which it only
		// prints: any output is a failure.
		t.Fatalf("systemd-analyze verify %s: %v\n%s%s", unitFile, err, stdout, stderr)
	}

	// The check has teeth: a missing ExecStart binary and an unknown key
	// are both reported.
	if err := os.Remove(filepath.Join(root, "usr/bin/gatewayd")); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := run(t, analyze, "verify", "--man=no", "--root="+root, unitFile); err == nil ||
		!strings.Contains(stderr, "/usr/bin/gatewayd") {
		t.Errorf("verify without /usr/bin/gatewayd: err %v, stderr %q; want a failure naming it", err, stderr)
	}
	bad := filepath.Join(root, "usr/lib/systemd/system/greenhouse-gateway-typo.service")
	unit, _ := os.ReadFile(unitFile)
	if err := os.WriteFile(bad, bytes.Replace(unit, []byte("ProtectHome=yes"), []byte("ProtectHomes=yes"), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	if stdout, stderr, _ := run(t, analyze, "verify", "--man=no", "--root="+root, filepath.Base(bad)); !strings.Contains(stdout+stderr, "ProtectHomes") {
		t.Errorf("verify of a unit with a misspelt key printed %q; want a warning naming it", stdout+stderr)
	}
}

// securityItem is one check of systemd-analyze security --json.
type securityItem struct {
	Set         bool    `json:"set"`
	Name        string  `json:"name"`
	JSONField   string  `json:"json_field"`
	Description string  `json:"description"`
	Exposure    *string `json:"exposure"`
}

var overallRE = regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+) (\S+)`)

func TestSecurityExposure(t *testing.T) {
	analyze := systemdAnalyze(t)

	stdout, stderr, err := run(t, analyze, "security", "--offline=yes", "--no-pager", unitFile)
	if err != nil {
		t.Fatalf("systemd-analyze security --offline=yes: %v\n%s%s", err, stdout, stderr)
	}
	m := overallRE.FindStringSubmatch(stdout)
	if m == nil {
		t.Fatalf("no overall exposure level in:\n%s%s", stdout, stderr)
	}
	level, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("overall exposure level: %s %s (at most %.1f allowed)", m[1], m[2], maxExposure)
	if level > maxExposure || m[2] != "OK" {
		t.Errorf("exposure level %s %s; want at most %.1f and OK:\n%s", m[1], m[2], maxExposure, stdout)
	}

	stdout, stderr, err = run(t, analyze, "security", "--offline=yes", "--no-pager", "--json=short", unitFile)
	if err != nil {
		t.Fatalf("systemd-analyze security --json=short: %v\n%s", err, stderr)
	}
	var items []securityItem
	if err := json.Unmarshal([]byte(stdout), &items); err != nil {
		t.Fatalf("decoding systemd-analyze security --json: %v\n%s", err, stdout)
	}
	if len(items) < 50 {
		t.Fatalf("only %d security checks reported", len(items))
	}
	seen := map[string]bool{}
	for _, it := range items {
		seen[it.JSONField] = true
		if it.Set {
			continue
		}
		if _, ok := acceptedExposures[it.JSONField]; !ok {
			exp := "?"
			if it.Exposure != nil {
				exp = *it.Exposure
			}
			t.Errorf("security check %s fails (exposure %s): %s", it.Name, exp, it.Description)
		}
	}
	// The settings the unit is meant to have, by name, so that a
	// systemd that renames a check does not silently drop it.
	for _, f := range []string{
		"NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices",
		"ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups",
		"RestrictNamespaces_user", "LockPersonality", "MemoryDenyWriteExecute", "RestrictRealtime",
		"SystemCallArchitectures", "SystemCallFilter_privileged", "CapabilityBoundingSet_CAP_SYS_ADMIN",
		"CapabilityBoundingSet_CAP_SYS_MODULE", "UserOrDynamicUser",
		"RestrictAddressFamilies_AF_PACKET", "RestrictAddressFamilies_AF_NETLINK",
	} {
		if !seen[f] {
			t.Errorf("systemd-analyze security reports no check %s", f)
		}
	}
}

func TestSysusers(t *testing.T) {
	systemdAnalyze(t) // the same package ships systemd-sysusers
	sysusers, err := exec.LookPath("systemd-sysusers")
	if err != nil {
		t.Skipf("skipping: systemd-sysusers is not installed: %v", err)
	}
	root := t.TempDir()
	copyFile(t, sysusersFile, filepath.Join(root, "usr/lib/sysusers.d/greenhouse-gateway.conf"), 0o644)
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Twice: the postinst runs it at every configure.
	for range 2 {
		if stdout, stderr, err := run(t, sysusers, "--root="+root, "greenhouse-gateway.conf"); err != nil {
			t.Fatalf("systemd-sysusers: %v\n%s%s", err, stdout, stderr)
		}
	}
	passwd := readFile(t, filepath.Join(root, "etc/passwd"))
	fields := strings.Split(strings.TrimSpace(passwd), ":")
	if len(fields) != 7 || fields[0] != serviceUser || fields[5] != "/" || fields[6] != "/usr/sbin/nologin" {
		t.Fatalf("/etc/passwd = %q; want one entry for %s, home /, shell /usr/sbin/nologin", passwd, serviceUser)
	}
	if uid, _ := strconv.Atoi(fields[2]); uid == 0 || uid >= 1000 {
		t.Errorf("uid %d is not a system uid", uid)
	}
	if group := readFile(t, filepath.Join(root, "etc/group")); !strings.HasPrefix(group, serviceUser+":x:"+fields[3]+":") {
		t.Errorf("/etc/group = %q; want group %s with gid %s", group, serviceUser, fields[3])
	}
}

func readFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// unitSettings parses a unit file into its settings, by section and key,
// in order (a key may repeat).
func unitSettings(t testing.TB, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[':
			section = strings.Trim(line, "[]")
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("%s: malformed line %q", path, line)
			}
			out[section+"."+k] = append(out[section+"."+k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func one(t testing.TB, s map[string][]string, key string) string {
	t.Helper()
	v := s[key]
	if len(v) != 1 {
		t.Fatalf("%s: %d values %q, want one", key, len(v), v)
	}
	return v[0]
}

// TestUnitMatchesConfig checks what the unit, gateway.yaml and gateway.env
// must agree on.
func TestUnitMatchesConfig(t *testing.T) {
	s := unitSettings(t, unitFile)
	var cfg struct {
		DataDir          string        `yaml:"data_dir"`
		ShutdownTimeout  time.Duration `yaml:"shutdown_timeout"`
		APIKeyPepperFile string        `yaml:"api_key_pepper_file"`
		MQTT             struct {
			Addr string `yaml:"addr"`
		} `yaml:"mqtt"`
		HTTP struct {
			Addr string `yaml:"addr"`
		} `yaml:"http"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, configFile)), &cfg); err != nil {
		t.Fatalf("%s: %v", configFile, err)
	}

	env := map[string]string{}
	for _, e := range s["Service.Environment"] {
		k, v, _ := strings.Cut(e, "=")
		env[k] = v
	}

	tests := []struct {
		name      string
		got, want string
	}{
		{"type", one(t, s, "Service.Type"), "notify"},
		{"notify access", one(t, s, "Service.NotifyAccess"), "main"},
		{"exec start", one(t, s, "Service.ExecStart"), "/usr/bin/gatewayd --config /etc/greenhouse-gateway/" + configFile},
		{"user", one(t, s, "Service.User"), serviceUser},
		{"group", one(t, s, "Service.Group"), serviceUser},
		{"data_dir is the state directory", cfg.DataDir, "/var/lib/" + one(t, s, "Service.StateDirectory")},
		{"pepper from the credential", env["GATEWAY_API_KEY_PEPPER_FILE"], "%d/api_key_pepper"},
		{"admin token from the credential", env["GATEWAY_ADMIN_TOKEN_FILE"], "%d/admin_token"},
		{"memory limit", env["GOMEMLIMIT"], "200MiB"},
		{"memory max", one(t, s, "Service.MemoryMax"), "256M"},
		{"capabilities", one(t, s, "Service.CapabilityBoundingSet"), ""},
		{"environment file", one(t, s, "Service.EnvironmentFile"), "-/etc/greenhouse-gateway/" + envFile},
		{"mqtt port unprivileged", cfg.MQTT.Addr, ":1883"},
		{"http port unprivileged", cfg.HTTP.Addr, ":8080"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, tt.got, tt.want)
		}
	}
	creds := map[string]bool{}
	for _, c := range s["Service.LoadCredential"] {
		creds[c] = true
	}
	for _, c := range []string{
		"api_key_pepper:/etc/greenhouse-gateway/api_key_pepper",
		"admin_token:/etc/greenhouse-gateway/admin_token",
	} {
		if !creds[c] {
			t.Errorf("no LoadCredential=%s", c)
		}
	}
	if cfg.APIKeyPepperFile != "" {
		t.Errorf("%s sets api_key_pepper_file %q, which the unit's environment overrides", configFile, cfg.APIKeyPepperFile)
	}

	stop, err := time.ParseDuration(one(t, s, "Service.TimeoutStopSec"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ShutdownTimeout <= 0 || stop < cfg.ShutdownTimeout+5*time.Second {
		t.Errorf("TimeoutStopSec %s leaves no margin over shutdown_timeout %s", stop, cfg.ShutdownTimeout)
	}
	if wd, err := time.ParseDuration(one(t, s, "Service.WatchdogSec")); err != nil || wd < 10*time.Second {
		t.Errorf("WatchdogSec %q: want at least 10s (pings every half of it)", one(t, s, "Service.WatchdogSec"))
	}

	// Every variable the environment file shows is commented out: the
	// file ships without values.
	for i, line := range strings.Split(readFile(t, envFile), "\n") {
		if l := strings.TrimSpace(line); l != "" && l[0] != '#' {
			t.Errorf("%s:%d: %q is set; the shipped file only documents variables", envFile, i+1, l)
		}
	}
}
