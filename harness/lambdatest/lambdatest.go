//go:build unix

// Package lambdatest runs the readings function (cmd/function) under the
// AWS Lambda Runtime Interface Emulator, for tests and local runs:
//
//	bootstrap := lambdatest.BuildFunction(t)
//	em := lambdatest.Start(t, bootstrap, map[string]string{"API_KEY_PEPPER": ..., "DYNAMODB_ENDPOINT": ...})
//	out, err := em.Invoke(ctx, payload) // or em.Client(t) with function name "function"
//
// The emulator (github.com/aws/aws-lambda-runtime-interface-emulator's
// cmd/aws-lambda-rie, at RIEVersion) is built with `go install` into
// <module root>/.cache/bin on first use, so only the Go module proxy is
// needed. It listens on 127.0.0.1 ports, in its own process group (the
// function process is its child), which Kill and the test's cleanup kill
// whole. The emulator crashes on two invokes at once (upstream issue #97),
// so it sits behind a small proxy that passes one invoke at a time:
// Endpoint is the proxy's URL, which stays the same across Restart.
package lambdatest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// RIEModule and RIEVersion are the emulator built: a pseudo-version the
// module proxy serves.
const (
	RIEModule  = "github.com/aws/aws-lambda-runtime-interface-emulator"
	RIEVersion = "v0.0.0-20261030222936-bef5c4ba774d"
)

const (
	buildTimeout = 5 * time.Minute
	startTimeout = 15 * time.Second
)

// moduleRoot is the directory of the main module's go.mod (go env GOMOD).
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	gomod := strings.TrimSpace(string(out))
	if err != nil || gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("no go.mod above the working directory (go env GOMOD: %q, %v)", gomod, err)
	}
	return filepath.Dir(gomod), nil
}

var builds struct {
	sync.Mutex
	paths map[string]string
	errs  map[string]error
}

// once builds what key names once per process.
func once(key string, build func() (string, error)) (string, error) {
	builds.Lock()
	defer builds.Unlock()
	if p, ok := builds.paths[key]; ok {
		return p, builds.errs[key]
	}
	p, err := build()
	if builds.paths == nil {
		builds.paths, builds.errs = map[string]string{}, map[string]error{}
	}
	builds.paths[key], builds.errs[key] = p, err
	return p, err
}

// RIEPath returns the emulator's binary, building it first when missing.
func RIEPath(tb testing.TB) string {
	tb.Helper()
	p, err := once("rie", BuildRIE)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// BuildRIE returns the emulator's binary in <module root>/.cache/bin,
// running go install of RIEVersion first when it is missing.
func BuildRIE() (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, ".cache", "bin", "aws-lambda-rie-"+RIEVersion)
	bin := filepath.Join(dir, "aws-lambda-rie")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "install", RIEModule+"/cmd/aws-lambda-rie@"+RIEVersion)
	cmd.Dir = os.TempDir() // outside this module: go install pkg@version ignores its go.mod anyway
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the Runtime Interface Emulator: %w\n%s", err, out)
	}
	return bin, nil
}

// BuildFunction builds cmd/function for this machine, once per process,
// into <module root>/.cache/lambdatest/bootstrap, and returns its path.
func BuildFunction(tb testing.TB) string {
	tb.Helper()
	p, err := FunctionBinary()
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// FunctionBinary is BuildFunction for programs that are not tests (the
// benchmark).
func FunctionBinary() (string, error) {
	return once("function", func() (string, error) {
		root, err := moduleRoot()
		if err != nil {
			return "", err
		}
		// Built beside the cache's other binaries and renamed into place:
		// emulators of other test processes keep running the file they
		// started, and nothing is left in /tmp.
		dir := filepath.Join(root, ".cache", "lambdatest")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", err
		}
		bin := filepath.Join(dir, "bootstrap")
		tmp := fmt.Sprintf("%s.%d.tmp", bin, os.Getpid())
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-tags", "lambda.norpc", "-o", tmp, "./cmd/function")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			_ = os.Remove(tmp)
			return "", fmt.Errorf("building cmd/function: %w\n%s", err, out)
		}
		return bin, os.Rename(tmp, bin)
	})
}

// env is the process environment with overrides: the emulator passes it to
// the function.
func env(overrides map[string]string) []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := overrides[k]; !ok && !strings.HasPrefix(k, "AWS_LAMBDA_") {
			out = append(out, kv)
		}
	}
	for k, v := range overrides {
		out = append(out, k+"="+v)
	}
	return out
}
