//go:build !linux

package testenv

import (
	"os"
	"syscall"
)

// stopSignal asks a control-plane binary to shut down. Outside Linux the
// binaries are not supported; os.Interrupt keeps the package compiling.
var stopSignal = os.Interrupt

// sysProcAttr returns nil: parent-death signals exist only on Linux, where
// the control plane is supported.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// groupProcAttr returns nil: process groups are left alone outside Linux.
func groupProcAttr() *syscall.SysProcAttr { return nil }

// killGroup kills p alone.
func killGroup(p *os.Process) error { return p.Kill() }
