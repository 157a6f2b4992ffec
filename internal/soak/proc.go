package soak

import (
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"syscall"
	"time"
)

// process is one child process (gatewayd or DynamoDB Local's JVM), in its
// own process group.
//
// Start and Wait run on one locked OS thread: on Linux the child gets
// PR_SET_PDEATHSIG=SIGKILL, which fires when the thread that forked it
// exits, so that thread lives exactly as long as the child. If the soak
// itself dies, its children die with it.
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and was reaped
	err  error         // Wait's result, valid after done
}

func startProcess(name string, cmd *exec.Cmd) (*process, error) {
	cmd.SysProcAttr = sysProcAttr()
	p := &process{name: name, cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the child
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	return p, nil
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has exited.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits at most timeout for the process to exit.
func (p *process) wait(timeout time.Duration) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

// exitCode is the exit status after the process exited: -1 when a signal
// ended it.
func (p *process) exitCode() int {
	if p.cmd.ProcessState == nil {
		return -1
	}
	return p.cmd.ProcessState.ExitCode()
}

// exitDescription describes how the process ended.
func (p *process) exitDescription() string {
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.Error()
	}
	if p.err != nil {
		return p.err.Error()
	}
	return "exit status 0"
}

// signal sends sig to the process group.
func (p *process) signal(sig syscall.Signal) error {
	if p.exited() {
		return fmt.Errorf("%s (pid %d) has exited: %s", p.name, p.pid(), p.exitDescription())
	}
	if err := syscall.Kill(-p.pid(), sig); err != nil {
		return fmt.Errorf("signal %v to %s (process group %d): %w", sig, p.name, p.pid(), err)
	}
	return nil
}

// kill sends SIGKILL to the process group and waits, at most 15 seconds,
// until the process is reaped. A stopped (SIGSTOP) process is killed too.
func (p *process) kill() error {
	if p.exited() {
		return nil
	}
	_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
	if !p.wait(15 * time.Second) {
		return fmt.Errorf("%s (pid %d) not reaped 15s after SIGKILL", p.name, p.pid())
	}
	return nil
}
