// Package proc runs the child processes of the harness (gatewayd, DynamoDB
// Local's JVM, mosquitto and its clients, devicesim, for the soak, the
// benchmark, dynamotest and mosquittotest), each in its own process group,
// so that a signal reaches the whole tree and nothing outlives the run. It
// also picks a free port for a child and waits until the child listens.
package proc

import (
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"syscall"
	"time"
)

// Process is one child process in its own process group.
//
// Start and Wait run on one locked OS thread: on Linux the child gets
// PR_SET_PDEATHSIG=SIGKILL, which fires when the thread that forked it
// exits, so that thread lives exactly as long as the child. If the parent
// dies, its children die with it.
type Process struct {
	// Name names the process in errors.
	Name string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and was reaped
	err  error         // Wait's result, valid after done
}

// Start starts cmd (its SysProcAttr is replaced).
func Start(name string, cmd *exec.Cmd) (*Process, error) {
	cmd.SysProcAttr = sysProcAttr()
	p := &Process{Name: name, cmd: cmd, done: make(chan struct{})}
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

// Pid is the process's (and its group's) id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited and was reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is Wait's result once Done is closed.
func (p *Process) Err() error {
	select {
	case <-p.done:
		return p.err
	default:
		return nil
	}
}

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Wait waits at most timeout for the process to exit.
func (p *Process) Wait(timeout time.Duration) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

// ExitCode is the exit status after the process exited: -1 when a signal
// ended it.
func (p *Process) ExitCode() int {
	if p.cmd.ProcessState == nil {
		return -1
	}
	return p.cmd.ProcessState.ExitCode()
}

// ExitDescription describes how the process ended.
func (p *Process) ExitDescription() string {
	var ee *exec.ExitError
	if errors.As(p.Err(), &ee) {
		return ee.Error()
	}
	if err := p.Err(); err != nil {
		return err.Error()
	}
	return "exit status 0"
}

// Signal sends sig to the process group.
func (p *Process) Signal(sig syscall.Signal) error {
	if p.Exited() {
		return fmt.Errorf("%s (pid %d) has exited: %s", p.Name, p.Pid(), p.ExitDescription())
	}
	if err := syscall.Kill(-p.Pid(), sig); err != nil {
		return fmt.Errorf("signal %v to %s (process group %d): %w", sig, p.Name, p.Pid(), err)
	}
	return nil
}

// Kill sends SIGKILL to the process group and waits, at most 15 seconds,
// until the process is reaped. A stopped (SIGSTOP) process is killed too.
func (p *Process) Kill() error {
	if p.Exited() {
		return nil
	}
	_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
	if !p.Wait(15 * time.Second) {
		return fmt.Errorf("%s (pid %d) not reaped 15s after SIGKILL", p.Name, p.Pid())
	}
	return nil
}

// Stop sends SIGTERM to the process group, waits up to timeout, then kills
// the group. It returns an error when the process had to be killed.
func (p *Process) Stop(timeout time.Duration) error {
	if p.Exited() {
		return nil
	}
	_ = syscall.Kill(-p.Pid(), syscall.SIGTERM)
	if p.Wait(timeout) {
		return nil
	}
	_ = p.Kill()
	return fmt.Errorf("%s (pid %d) did not exit within %s of SIGTERM; killed", p.Name, p.Pid(), timeout)
}
