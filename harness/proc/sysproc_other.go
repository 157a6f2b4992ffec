//go:build unix && !linux

package proc

import "syscall"

// sysProcAttr puts a child in its own process group. Outside Linux there is
// no parent-death signal: a child of a parent killed with SIGKILL outlives it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// HasPdeathsig reports whether a child dies with the parent that started
// it even when the parent is killed without running any cleanup.
func HasPdeathsig() bool { return false }
