//go:build unix

package lambdatest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// make run UPLINK=lambda installs the emulator into the directory BuildRIE
// uses, at the same version.
func TestMakefileBuildsTheSameEmulator(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "RIE_VERSION ?= " + RIEVersion + "\n"; !strings.Contains(string(mk), want) {
		t.Errorf("the Makefile lacks %q", want)
	}
	if want := "GOBIN=$(CURDIR)/.cache/bin/aws-lambda-rie-$(RIE_VERSION)"; !strings.Contains(string(mk), want) {
		t.Errorf("the Makefile does not install into BuildRIE's directory (%q)", want)
	}
}
