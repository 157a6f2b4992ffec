//go:build unix && !linux

package mosquittotest

import "syscall"

// sysProcAttr puts the broker in its own process group, so Stop can signal the group. There
// is no parent-death signal outside Linux.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
