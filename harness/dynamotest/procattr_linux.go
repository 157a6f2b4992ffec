package dynamotest

import "syscall"

// sysProcAttr puts the JVM in its own process group (so Stop can kill the group) and asks
// the kernel to SIGKILL it when the thread that started it exits.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// hasPdeathsig reports whether the JVM dies with the thread that started it.
func hasPdeathsig() bool { return true }
