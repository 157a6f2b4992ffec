package systemd_test

import (
	"os"
	"regexp"
	"testing"
)

// TestNoRestartOnADamagedBuffer: the unit does not restart gatewayd on
// the exit status it ends with on a damaged buffer, and restarts it on
// every other failure.
func TestNoRestartOnADamagedBuffer(t *testing.T) {
	s := unitSettings(t, unitFile)
	src, err := os.ReadFile("../cmd/gatewayd/main.go")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`const exitDamagedBuffer = (\d+)`).FindSubmatch(src)
	if m == nil {
		t.Fatal("cmd/gatewayd/main.go: no exitDamagedBuffer constant")
	}
	if got := s["Service.RestartPreventExitStatus"]; len(got) != 1 || got[0] != string(m[1]) {
		t.Errorf("RestartPreventExitStatus=%q, want gatewayd's damaged-buffer status %s", got, m[1])
	}
	if got := s["Service.Restart"]; len(got) != 1 || got[0] != "on-failure" {
		t.Errorf("Restart=%q, want on-failure", got)
	}
}
