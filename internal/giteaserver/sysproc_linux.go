package giteaserver

import "syscall"

// sysProcAttr puts Gitea in its own process group, so that Stop also ends
// the git processes it runs, and has the kernel kill it when the test
// process dies, so that a crashed or timed-out test leaves nothing running.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
