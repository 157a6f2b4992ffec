// Package deploypackage_test builds the amd64 Debian package with
// `make package` and checks it: control fields, the files with their modes
// and owners, the conffiles, the maintainer scripts, that the packaged
// gatewayd prints the version it was built with and accepts the packaged
// configuration, and a whole install, reinstall, remove and purge cycle
// into a scratch root with dpkg --root (the maintainer scripts honour
// DPKG_ROOT and run chrootless). Then, as root, it runs the installed
// gatewayd the way the packaged unit would, against DynamoDB Local, and goes
// through what a new user does: the status page, a device key made with the
// packaged gatewayctl, a batch delivered, a stop (service_test.go).
//
// Skipped with -short. The first run compiles nfpm (about a minute); later
// runs take seconds, plus a few for DynamoDB Local.
package deploypackage_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"testing"
)

const (
	version    = "v0.7.1-3-gdeadbee"
	debVersion = "0.7.1+3.gdeadbee" // deploy/package/build.sh deb_version
	pkg        = "greenhouse-gateway"
)

func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root not found from %s: %v", root, err)
	}
	return root
}

func need(t testing.TB, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipping: %s is not installed", tool)
		}
	}
}

// cmd runs name with args and returns its stdout; it fails the test on
// error, with stderr.
func cmd(t testing.TB, env []string, name string, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	c := exec.Command(name, args...)
	c.Stdout, c.Stderr = &stdout, &stderr
	c.Env = append(os.Environ(), env...)
	if err := c.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// buildPackage runs `make package ARCHES=amd64` into a temporary dist
// directory and returns the .deb's path.
func buildPackage(t testing.TB) string {
	t.Helper()
	dist := t.TempDir()
	root := repoRoot(t)
	cmd(t, []string{"DIST=" + dist}, "make", "-C", root, "--no-print-directory", "package", "ARCHES=amd64", "VERSION="+version)
	deb := filepath.Join(dist, pkg+"_"+debVersion+"_amd64.deb")
	if _, err := os.Stat(deb); err != nil {
		entries, _ := os.ReadDir(dist)
		t.Fatalf("make package made no %s: %v (dist holds %v)", filepath.Base(deb), err, entries)
	}
	return deb
}

// entry is one line of dpkg-deb --contents.
type entry struct{ mode, owner string }

var contentsRE = regexp.MustCompile(`^(\S+)\s+(\S+)\s+\d+\s+\S+\s+\S+\s+\./(.*)$`)

func contents(t testing.TB, deb string) map[string]entry {
	t.Helper()
	out := map[string]entry{}
	for _, line := range strings.Split(strings.TrimSpace(cmd(t, nil, "dpkg-deb", "--contents", deb)), "\n") {
		m := contentsRE.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("unexpected dpkg-deb --contents line %q", line)
		}
		out["/"+strings.TrimSuffix(m[3], "/")] = entry{mode: m[1], owner: m[2]}
	}
	return out
}

func TestPackage(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: builds a Debian package (-short)")
	}
	need(t, "make", "dpkg-deb", "dpkg")
	deb := buildPackage(t)
	root := repoRoot(t)

	t.Run("control", func(t *testing.T) {
		fields := cmd(t, nil, "dpkg-deb", "--field", deb, "Package", "Version", "Architecture", "Depends")
		for _, want := range []string{
			"Package: " + pkg, "Version: " + debVersion, "Architecture: amd64", "Depends: systemd (>= 250)",
		} {
			if !strings.Contains(fields, want+"\n") {
				t.Errorf("control fields lack %q:\n%s", want, fields)
			}
		}
	})

	t.Run("files", func(t *testing.T) {
		got := contents(t, deb)
		want := map[string]entry{
			"/usr/bin/gatewayd":   {"-rwxr-xr-x", "root/root"},
			"/usr/bin/gatewayctl": {"-rwxr-xr-x", "root/root"},
			"/usr/lib/systemd/system/greenhouse-gateway.service":                  {"-rw-r--r--", "root/root"},
			"/usr/lib/sysusers.d/greenhouse-gateway.conf":                         {"-rw-r--r--", "root/root"},
			"/etc/greenhouse-gateway":                                             {"drwxr-xr-x", "root/root"},
			"/etc/greenhouse-gateway/gateway.yaml":                                {"-rw-r--r--", "root/root"},
			"/etc/greenhouse-gateway/gateway.env":                                 {"-rw-------", "root/root"},
			"/usr/share/doc/greenhouse-gateway/README.md":                         {"-rw-r--r--", "root/root"},
			"/usr/share/doc/greenhouse-gateway/docs/configuration.md":             {"-rw-r--r--", "root/root"},
			"/usr/share/doc/greenhouse-gateway/docs/operations.md":                {"-rw-r--r--", "root/root"},
			"/usr/share/doc/greenhouse-gateway/docs/security.md":                  {"-rw-r--r--", "root/root"},
			"/usr/share/doc/greenhouse-gateway/monitoring/grafana-dashboard.json": {"-rw-r--r--", "root/root"},
			"/usr/share/doc/greenhouse-gateway/monitoring/alerts.yaml":            {"-rw-r--r--", "root/root"},
			"/usr/share/doc/greenhouse-gateway/monitoring/alerts_test.yaml":       {"-rw-r--r--", "root/root"},
		}
		for path, w := range want {
			if g, ok := got[path]; !ok {
				t.Errorf("%s is not in the package", path)
			} else if g != w {
				t.Errorf("%s: %s %s, want %s %s", path, g.mode, g.owner, w.mode, w.owner)
			}
		}
		for path, e := range got {
			if _, ok := want[path]; !ok && e.mode[0] != 'd' {
				t.Errorf("unexpected file %s in the package", path)
			}
			if e.owner != "root/root" {
				t.Errorf("%s is owned by %s, want root/root", path, e.owner)
			}
		}
		// The secrets are made at installation, never shipped.
		for _, secret := range []string{"/etc/greenhouse-gateway/api_key_pepper", "/etc/greenhouse-gateway/admin_token"} {
			if _, ok := got[secret]; ok {
				t.Errorf("%s is shipped; postinst must create it", secret)
			}
		}
	})

	t.Run("conffiles", func(t *testing.T) {
		got := strings.Fields(cmd(t, nil, "dpkg-deb", "--info", deb, "conffiles"))
		sort.Strings(got)
		want := []string{"/etc/greenhouse-gateway/gateway.env", "/etc/greenhouse-gateway/gateway.yaml"}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("conffiles %q, want %q", got, want)
		}
	})

	t.Run("maintainer scripts", func(t *testing.T) {
		dir := t.TempDir()
		cmd(t, nil, "dpkg-deb", "--control", deb, dir)
		for _, s := range []string{"postinst", "prerm", "postrm"} {
			fi, err := os.Stat(filepath.Join(dir, s))
			if err != nil {
				t.Errorf("no %s: %v", s, err)
				continue
			}
			if fi.Mode().Perm() != 0o755 {
				t.Errorf("%s mode %v, want 0755", s, fi.Mode().Perm())
			}
			same(t, filepath.Join(dir, s), filepath.Join(root, "deploy/package", s))
			cmd(t, nil, "sh", "-n", filepath.Join(dir, s)) // parses as POSIX sh
		}
	})

	t.Run("payload", func(t *testing.T) {
		dir := t.TempDir()
		cmd(t, nil, "dpkg-deb", "--extract", deb, dir)
		same(t, filepath.Join(dir, "usr/lib/systemd/system/greenhouse-gateway.service"), filepath.Join(root, "systemd/greenhouse-gateway.service"))
		same(t, filepath.Join(dir, "usr/lib/sysusers.d/greenhouse-gateway.conf"), filepath.Join(root, "systemd/greenhouse-gateway.sysusers"))
		same(t, filepath.Join(dir, "etc/greenhouse-gateway/gateway.yaml"), filepath.Join(root, "systemd/gateway.yaml"))
		same(t, filepath.Join(dir, "etc/greenhouse-gateway/gateway.env"), filepath.Join(root, "systemd/gateway.env"))
		for _, f := range []string{"grafana-dashboard.json", "alerts.yaml", "alerts_test.yaml"} {
			same(t, filepath.Join(dir, "usr/share/doc/greenhouse-gateway/monitoring", f), filepath.Join(root, "deploy/monitoring", f))
		}
		if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
			t.Skipf("skipping the run of the amd64 binaries on %s/%s", runtime.GOOS, runtime.GOARCH)
		}
		gatewayd := filepath.Join(dir, "usr/bin/gatewayd")
		if got := cmd(t, nil, gatewayd, "--version"); got != "gatewayd "+version+"\n" {
			t.Errorf("gatewayd --version printed %q, want %q", got, "gatewayd "+version+"\n")
		}
		if got := cmd(t, nil, filepath.Join(dir, "usr/bin/gatewayctl"), "--version"); got != "gatewayctl "+version+"\n" {
			t.Errorf("gatewayctl --version printed %q", got)
		}
		// The packaged configuration decodes strictly; with the unit's
		// environment the credentials are where systemd puts them.
		cfg := cmd(t, []string{"GATEWAY_API_KEY_PEPPER_FILE=/run/credentials/greenhouse-gateway.service/api_key_pepper"},
			gatewayd, "--config", filepath.Join(dir, "etc/greenhouse-gateway/gateway.yaml"), "--print-config")
		for _, want := range []string{
			"data_dir: /var/lib/greenhouse-gateway\n",
			"api_key_pepper_file: /run/credentials/greenhouse-gateway.service/api_key_pepper\n",
			"shutdown_timeout: 20s\n",
		} {
			if !strings.Contains(cfg, want) {
				t.Errorf("gatewayd --print-config with the packaged config lacks %q:\n%s", want, cfg)
			}
		}
	})

	t.Run("monitoring", func(t *testing.T) {
		dir := t.TempDir()
		cmd(t, nil, "dpkg-deb", "--extract", deb, dir)
		testMonitoring(t, dir)
	})

	t.Run("install remove purge", func(t *testing.T) {
		need(t, "systemd-sysusers")
		testLifecycle(t, deb)
	})

	t.Run("run as the unit", func(t *testing.T) {
		need(t, "systemd-sysusers")
		if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
			t.Skipf("skipping the run of the amd64 binaries on %s/%s", runtime.GOOS, runtime.GOARCH)
		}
		if os.Geteuid() != 0 {
			t.Skip("skipping: starting gatewayd in the scratch root as its system user (chroot, setuid) needs root")
		}
		testService(t, deb)
	})
}

func same(t testing.TB, got, want string) {
	t.Helper()
	a, err := os.ReadFile(got)
	if err != nil {
		t.Error(err)
		return
	}
	b, err := os.ReadFile(want)
	if err != nil {
		t.Error(err)
		return
	}
	if !bytes.Equal(a, b) {
		t.Errorf("%s differs from %s", got, want)
	}
}

// scratchRoot makes an empty root with a dpkg database and returns it with
// a function that runs dpkg on it: dpkg --root, maintainer scripts run
// chrootless with DPKG_ROOT set, conffiles kept. systemd itself is not in
// the scratch root: --force-depends.
func scratchRoot(t testing.TB) (string, func(args ...string) string) {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "var/lib/dpkg/status"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dpkg := func(args ...string) string {
		t.Helper()
		return cmd(t, nil, "dpkg", append([]string{"--root=" + root, "--force-not-root", "--force-script-chrootless",
			"--force-depends", "--force-confold"}, args...)...)
	}
	return root, dpkg
}

// testLifecycle installs the package into a scratch root with dpkg --root
// (maintainer scripts run chrootless with DPKG_ROOT set), then reinstalls,
// removes and purges it, checking what each step leaves.
func testLifecycle(t *testing.T, deb string) {
	root, dpkg := scratchRoot(t)
	p := func(rel string) string { return filepath.Join(root, rel) }
	etc := "etc/greenhouse-gateway"

	// 1. Install: the user, the secrets (root-only, random), no start.
	out := dpkg("--install", deb)
	if !strings.Contains(out, "neither enabled nor started") {
		t.Errorf("first installation did not print the next steps:\n%s", out)
	}
	if status := dpkg("--status", pkg); !strings.Contains(status, "Status: install ok installed") {
		t.Fatalf("not installed:\n%s", status)
	}
	passwd := readFile(t, p("etc/passwd"))
	if !regexp.MustCompile(`(?m)^greenhouse-gateway:x:\d+:\d+:[^:]*:/:/usr/sbin/nologin$`).MatchString(passwd) {
		t.Errorf("no system user greenhouse-gateway in /etc/passwd:\n%s", passwd)
	}
	secrets := map[string][32]byte{}
	for _, s := range []string{"api_key_pepper", "admin_token"} {
		path := p(filepath.Join(etc, s))
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatalf("postinst made no %s: %v", s, err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", s, fi.Mode().Perm())
		}
		v := readFile(t, path)
		if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(v) {
			t.Errorf("%s = %q, want 64 hex digits", s, v)
		}
		secrets[s] = sha256.Sum256([]byte(v))
	}
	if a, b := secrets["api_key_pepper"], secrets["admin_token"]; a == b {
		t.Error("the pepper and the admin token are equal")
	}

	// The operator configures, enables, and the gateway stores data.
	yamlPath := p(filepath.Join(etc, "gateway.yaml"))
	edited := readFile(t, yamlPath) + "# edited by the operator\n"
	if err := os.WriteFile(yamlPath, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	wants := p("etc/systemd/system/multi-user.target.wants/greenhouse-gateway.service")
	canEnable := false
	if _, err := exec.LookPath("systemctl"); err == nil {
		cmd(t, nil, "systemctl", "--root="+root, "enable", "greenhouse-gateway.service")
		if _, err := os.Lstat(wants); err != nil {
			t.Fatalf("systemctl --root enable made no %s: %v", wants, err)
		}
		canEnable = true
	}
	data := p("var/lib/greenhouse-gateway/000001.vlog")
	if err := os.MkdirAll(filepath.Dir(data), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(data, []byte("buffer"), 0o600); err != nil {
		t.Fatal(err)
	}

	// 2. Reinstall (an upgrade, for dpkg): edited conffile and secrets kept.
	dpkg("--install", deb)
	if got := readFile(t, yamlPath); got != edited {
		t.Error("reinstalling replaced the edited gateway.yaml")
	}
	for s, sum := range secrets {
		if sha256.Sum256([]byte(readFile(t, p(filepath.Join(etc, s))))) != sum {
			t.Errorf("reinstalling changed %s", s)
		}
	}

	// 3. Remove: disabled; data, configuration and secrets stay.
	dpkg("--remove", pkg)
	if canEnable {
		if _, err := os.Lstat(wants); err == nil {
			t.Error("removing left the service enabled")
		}
	}
	for _, f := range []string{"usr/bin/gatewayd", "usr/lib/systemd/system/greenhouse-gateway.service"} {
		if _, err := os.Stat(p(f)); err == nil {
			t.Errorf("removing left %s", f)
		}
	}
	for _, f := range []string{"var/lib/greenhouse-gateway/000001.vlog", etc + "/gateway.yaml", etc + "/gateway.env",
		etc + "/api_key_pepper", etc + "/admin_token"} {
		if _, err := os.Stat(p(f)); err != nil {
			t.Errorf("removing deleted %s: %v", f, err)
		}
	}

	// 4. Purge: data, configuration and secrets gone; the user stays.
	dpkg("--purge", pkg)
	for _, f := range []string{"var/lib/greenhouse-gateway", etc} {
		if _, err := os.Stat(p(f)); err == nil {
			t.Errorf("purging left %s", f)
		}
	}
	if !strings.Contains(readFile(t, p("etc/passwd")), "greenhouse-gateway:") {
		t.Error("purging deleted the system user")
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

// testMonitoring checks that a cloud operator with only the installed
// package finds the dashboard and the alerts, and how to import them: the
// packaged README names their packaged place, the dashboard's data source
// variable and the job the alerts expect; with promtool installed, the
// alerts' tests pass from the packaged directory.
func testMonitoring(t *testing.T, dir string) {
	doc := filepath.Join(dir, "usr/share/doc/greenhouse-gateway")
	readme := readFile(t, filepath.Join(doc, "README.md"))
	mon := filepath.Join(doc, "monitoring")
	if !strings.Contains(readme, "`/usr/share/doc/greenhouse-gateway/monitoring/`") {
		t.Error("the packaged README does not say where the package puts the dashboard and the alerts")
	}

	var dashboard struct {
		Templating struct {
			List []struct{ Name, Type string } `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal([]byte(readFile(t, filepath.Join(mon, "grafana-dashboard.json"))), &dashboard); err != nil {
		t.Fatalf("packaged dashboard: %v", err)
	}
	datasources := 0
	for _, v := range dashboard.Templating.List {
		if v.Type == "datasource" {
			datasources++
			if !strings.Contains(readme, "`"+v.Name+"`") {
				t.Errorf("the README's import steps do not name the dashboard's data source variable %s", v.Name)
			}
		}
	}
	if datasources == 0 {
		t.Error("the packaged dashboard has no data source variable to pick Prometheus with")
	}

	jobs := regexp.MustCompile(`job="([^"]+)"`).FindAllStringSubmatch(readFile(t, filepath.Join(mon, "alerts.yaml")), -1)
	if len(jobs) == 0 {
		t.Fatal("the packaged alerts name no job")
	}
	for _, m := range jobs {
		if !strings.Contains(readme, "as job `"+m[1]+"`") {
			t.Errorf("the packaged alerts select job %q; the README does not tell operators to scrape as that job", m[1])
		}
	}

	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("skipping promtool on the packaged alerts: promtool is not installed (Debian package prometheus)")
	}
	c := exec.Command(promtool, "test", "rules", "alerts_test.yaml")
	c.Dir = mon
	if out, err := c.CombinedOutput(); err != nil {
		t.Errorf("promtool test rules in %s: %v\n%s", mon, err, out)
	}
}
