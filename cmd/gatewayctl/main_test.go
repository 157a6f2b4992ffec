package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/internal/cloud"
)

func TestMain(m *testing.M) { dynamotest.Main(m) }

// gatewayctl is the built binary plus the environment it runs with.
type gatewayctl struct {
	bin string
	env []string
}

type result struct {
	code           int
	stdout, stderr string
}

func (g gatewayctl) run(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, g.bin, args...)
	cmd.Env = append(append([]string{}, g.env...), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("running gatewayctl %v: %v", args, err)
	}
	r := result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
	t.Logf("gatewayctl %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	return r
}

// build compiles gatewayctl into a temporary directory, with a version stamped in.
func build(t *testing.T) gatewayctl {
	t.Helper()
	goBin, err := exec.LookPath("go")
	require.NoError(t, err, "the go command must be on PATH")
	bin := filepath.Join(t.TempDir(), "gatewayctl")
	cmd := exec.Command(goBin, "build", "-o", bin, "-ldflags", "-X main.version=v9.9.9-test", ".")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	// Keep the SDK from finding a real region or credentials; GATEWAY_* come per test.
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GATEWAY_") && !strings.HasPrefix(kv, "AWS_") {
			env = append(env, kv)
		}
	}
	home := t.TempDir()
	env = append(env, "HOME="+home, "AWS_CONFIG_FILE="+filepath.Join(home, "config"),
		"AWS_SHARED_CREDENTIALS_FILE="+filepath.Join(home, "credentials"), "AWS_EC2_METADATA_DISABLED=true")
	return gatewayctl{bin: bin, env: env}
}

var rawKeyLine = regexp.MustCompile(`^[0-9a-f]{64}\n$`)

func TestGatewayctl(t *testing.T) {
	g := build(t)

	t.Run("version", func(t *testing.T) {
		r := g.run(t, nil, "--version")
		require.Equal(t, 0, r.code)
		require.Equal(t, "gatewayctl v9.9.9-test\n", r.stdout)
	})

	t.Run("usage", func(t *testing.T) {
		tests := []struct {
			name       string
			env        []string
			args       []string
			wantCode   int
			wantStderr string
		}{
			{name: "no command", wantCode: 2, wantStderr: "usage: gatewayctl <command>"},
			{name: "unknown command", args: []string{"frobnicate", "now"}, wantCode: 2, wantStderr: `unknown command "frobnicate now"`},
			{name: "missing subcommand", args: []string{"keys"}, wantCode: 2, wantStderr: `"keys" needs a subcommand`},
			{name: "unknown subcommand", args: []string{"tables", "drop"}, wantCode: 2, wantStderr: `unknown command "tables drop"`},
			{name: "unknown flag", args: []string{"tables", "create", "--bogus"}, wantCode: 2, wantStderr: "flag provided but not defined: -bogus"},
			{name: "revoke without id", args: []string{"keys", "revoke"}, wantCode: 2, wantStderr: "want KEY_ID, got 0 arguments"},
			{name: "revoke with two ids", args: []string{"keys", "revoke", "a", "b"}, wantCode: 2, wantStderr: "want KEY_ID, got 2 arguments"},
			{name: "list with argument", args: []string{"keys", "list", "extra"}, wantCode: 2, wantStderr: "unexpected arguments"},
			{name: "bad endpoint", args: []string{"tables", "create", "--dynamodb-endpoint", "localhost:8000"}, wantCode: 2, wantStderr: `--dynamodb-endpoint (GATEWAY_DYNAMODB_ENDPOINT) "localhost:8000": want an absolute http or https URL`},
			{name: "bad prefix from env", env: []string{"GATEWAY_TABLE_PREFIX=a/b"}, args: []string{"keys", "list"}, wantCode: 2, wantStderr: `--table-prefix (GATEWAY_TABLE_PREFIX) "a/b": only`},
			{name: "create without pepper", args: []string{"keys", "create", "--dynamodb-endpoint", "http://127.0.0.1:1"}, wantCode: 2, wantStderr: "GATEWAY_API_KEY_PEPPER"},
			{name: "bound key, lower case", args: []string{"keys", "create", "--hardware-id", "aa:bb:cc:dd:ee:ff"}, wantCode: 2,
				wantStderr: `gatewayctl keys create: --hardware-id: must be upper case, like AA:BB:CC:DD:EE:FF, got "aa:bb:cc:dd:ee:ff"`},
			{name: "bound key, not a MAC", args: []string{"keys", "create", "--hardware-id", "sensor-1"}, wantCode: 2,
				wantStderr: `--hardware-id: must be a MAC address in upper case, like AA:BB:CC:DD:EE:FF (^[0-9A-F]{2}(:[0-9A-F]{2}){5}$), got "sensor-1"`},
			{name: "devices without subcommand", args: []string{"devices"}, wantCode: 2, wantStderr: `"devices" needs a subcommand`},
			{name: "subcommand help", args: []string{"keys", "revoke", "-h"}, wantCode: 0, wantStderr: "usage: gatewayctl keys revoke [flags] KEY_ID"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				r := g.run(t, tt.env, tt.args...)
				require.Equal(t, tt.wantCode, r.code)
				require.Contains(t, r.stderr, tt.wantStderr)
				require.Empty(t, r.stdout)
			})
		}
		r := g.run(t, nil, "-h")
		require.Equal(t, 0, r.code)
		require.Contains(t, r.stdout, "keys revoke")
	})

	t.Run("against dynamodb local", func(t *testing.T) {
		db := dynamotest.Shared(t)
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		prefix := "ctl" + hex.EncodeToString(b) + "_"
		flags := []string{"--dynamodb-endpoint", db.Endpoint, "--table-prefix", prefix}
		tables := cloud.TableNames(prefix)

		for i := range 2 {
			r := g.run(t, nil, append([]string{"tables", "create"}, flags...)...)
			require.Equal(t, 0, r.code, "tables create #%d", i+1)
			require.Empty(t, r.stdout)
		}
		out, err := db.Client(t).ListTables(t.Context(), nil)
		require.NoError(t, err)
		for _, name := range tables.All() {
			require.Contains(t, out.TableNames, name)
		}

		r := g.run(t, nil, append([]string{"tables", "probe"}, flags...)...)
		require.Equal(t, 0, r.code)
		require.Equal(t, "10\n", r.stdout)

		// Pepper from the environment.
		r = g.run(t, []string{"GATEWAY_API_KEY_PEPPER=env-pepper"},
			append([]string{"keys", "create", "--description", "greenhouse A"}, flags...)...)
		require.Equal(t, 0, r.code)
		require.Regexp(t, rawKeyLine, r.stdout)
		rawA := strings.TrimSpace(r.stdout)

		// Pepper from a file (wins over the environment), configuration from the environment.
		pepperFile := filepath.Join(t.TempDir(), "pepper")
		require.NoError(t, os.WriteFile(pepperFile, []byte("file-pepper\n"), 0o600))
		envConfig := []string{"GATEWAY_DYNAMODB_ENDPOINT=" + db.Endpoint, "GATEWAY_TABLE_PREFIX=" + prefix,
			"GATEWAY_AWS_REGION=eu-west-1", "GATEWAY_API_KEY_PEPPER=env-pepper"}
		r = g.run(t, envConfig, "keys", "create", "--api-key-pepper-file", pepperFile)
		require.Equal(t, 0, r.code)
		require.Regexp(t, rawKeyLine, r.stdout)
		rawB := strings.TrimSpace(r.stdout)

		client := db.Client(t)
		infoA, found, err := cloud.NewKeys(client, tables.APIKeys, "env-pepper").Lookup(t.Context(), rawA)
		require.NoError(t, err)
		require.True(t, found)
		require.True(t, infoA.Active)
		require.Equal(t, "greenhouse A", infoA.Description)
		require.Contains(t, r.stderr, "created api key")
		infoB, found, err := cloud.NewKeys(client, tables.APIKeys, "file-pepper").Lookup(t.Context(), rawB)
		require.NoError(t, err)
		require.True(t, found, "the pepper file must win over GATEWAY_API_KEY_PEPPER")

		require.Empty(t, infoA.HardwareID, "a key without --hardware-id is a fleet key")

		// A device key: bound to its hardware_id, said on stderr; stdout is the raw key alone.
		const hw = "AA:BB:CC:DD:EE:01"
		r = g.run(t, []string{"GATEWAY_API_KEY_PEPPER=env-pepper"},
			append([]string{"keys", "create", "--hardware-id", hw, "--description", "sensor 1"}, flags...)...)
		require.Equal(t, 0, r.code)
		require.Regexp(t, rawKeyLine, r.stdout)
		require.Contains(t, r.stderr, "a device key bound to hardware_id "+hw+": it authenticates that device only")
		infoC, found, err := cloud.NewKeys(client, tables.APIKeys, "env-pepper").Lookup(t.Context(), strings.TrimSpace(r.stdout))
		require.NoError(t, err)
		require.True(t, found)
		require.Equal(t, hw, infoC.HardwareID)
		require.Equal(t, "sensor 1", infoC.Description)

		r = g.run(t, nil, append([]string{"keys", "list"}, flags...)...)
		require.Equal(t, 0, r.code)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		require.Len(t, lines, 4)
		require.Regexp(t, `^KEY_ID\s+ACTIVE\s+BINDING\s+CREATED_AT\s+LAST_USED_AT\s+DESCRIPTION$`, lines[0])
		require.Regexp(t, `^`+infoA.KeyID+`\s+true\s+fleet\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\s+-\s+greenhouse A$`, findLine(t, lines, infoA.KeyID))
		require.Regexp(t, `^`+infoB.KeyID+`\s+true\s+fleet\s+\S+\s+-\s*$`, findLine(t, lines, infoB.KeyID))
		require.Regexp(t, `^`+infoC.KeyID+`\s+true\s+`+hw+`\s+\S+\s+-\s+sensor 1$`, findLine(t, lines, infoC.KeyID))

		r = g.run(t, nil, append([]string{"keys", "list", "--json"}, flags...)...)
		require.Equal(t, 0, r.code)
		var listed []map[string]any
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &listed))
		require.Len(t, listed, 3)
		byID := map[string]map[string]any{}
		for _, k := range listed {
			byID[k["key_id"].(string)] = k
			require.NotContains(t, k, "api_key_hash")
			require.NotContains(t, r.stdout, infoA.Hash, "keys list never prints a hash")
		}
		require.Equal(t, map[string]any{"key_id": infoA.KeyID, "active": true, "binding": "fleet", "hardware_id": nil,
			"created_at": cloud.FormatTime(infoA.CreatedAt), "last_used_at": nil, "description": "greenhouse A"}, byID[infoA.KeyID])
		require.Equal(t, map[string]any{"key_id": infoC.KeyID, "active": true, "binding": hw, "hardware_id": hw,
			"created_at": cloud.FormatTime(infoC.CreatedAt), "last_used_at": nil, "description": "sensor 1"}, byID[infoC.KeyID])
		require.Equal(t, "fleet", byID[infoB.KeyID]["binding"])

		// Flags after the key id work too.
		r = g.run(t, nil, append([]string{"keys", "revoke", infoA.KeyID}, flags...)...)
		require.Equal(t, 0, r.code)
		require.Empty(t, r.stdout)
		r = g.run(t, envConfig, "keys", "list")
		require.Equal(t, 0, r.code)
		require.Regexp(t, `^`+infoA.KeyID+`\s+false\s`, findLine(t, strings.Split(r.stdout, "\n"), infoA.KeyID))

		r = g.run(t, nil, append(append([]string{"keys", "revoke"}, flags...), "7c9e6679-7425-40de-944b-e07fc1f90ae7")...)
		require.Equal(t, 1, r.code)
		require.Contains(t, r.stderr, "api key not found")
	})

	t.Run("unreachable endpoint", func(t *testing.T) {
		r := g.run(t, nil, "tables", "probe", "--dynamodb-endpoint", "http://127.0.0.1:1", "--timeout", "2s")
		require.Equal(t, 1, r.code)
		require.Contains(t, r.stderr, "gatewayctl tables probe:")
	})
}

func findLine(t *testing.T, lines []string, prefix string) string {
	t.Helper()
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	t.Fatalf("no line starting with %s in %q", prefix, lines)
	return ""
}
