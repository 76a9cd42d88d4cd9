package testenv

import (
	"os"
	"syscall"
)

// stopSignal asks a control-plane binary to shut down gracefully.
var stopSignal os.Signal = syscall.SIGTERM

// sysProcAttr puts each binary in its own process group, so a Ctrl-C at the
// terminal reaches only the test process, and has the kernel kill the binary
// when the test process dies, so a crashed or timed-out test leaves nothing
// running.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// groupProcAttr puts a build script in a process group of its own, which
// killGroup kills with everything it started; it also dies with the test
// process.
func groupProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup kills the process group p leads.
func killGroup(p *os.Process) error {
	return syscall.Kill(-p.Pid, syscall.SIGKILL)
}
