//go:build unix && !linux

package dynamotest

import "syscall"

// sysProcAttr puts the JVM in its own process group, so Stop can kill the group. There is
// no parent-death signal outside Linux.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// hasPdeathsig reports whether the JVM dies with the thread that started it.
func hasPdeathsig() bool { return false }
