//go:build unix && !linux

package proc

import "syscall"

// sysProcAttr puts a child in its own process group. Outside Linux there is
// no parent-death signal: a child of a parent killed with SIGKILL outlives it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
