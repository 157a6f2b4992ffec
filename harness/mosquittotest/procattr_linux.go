package mosquittotest

import "syscall"

// sysProcAttr puts the broker in its own process group (so Stop can signal the group) and
// asks the kernel to SIGKILL it when the thread that started it exits.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
