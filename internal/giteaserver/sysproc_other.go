//go:build !linux

package giteaserver

import "syscall"

// sysProcAttr puts Gitea in its own process group; parent-death signals
// exist only on Linux, where the tests run.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
