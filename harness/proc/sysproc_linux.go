package proc

import "syscall"

// sysProcAttr puts a child in its own process group and has the kernel
// SIGKILL it when the thread that started it exits.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// HasPdeathsig reports whether a child dies with the parent that started
// it even when the parent is killed without running any cleanup.
func HasPdeathsig() bool { return true }
