//go:build unix && !linux

package rabbitmqserver

import "syscall"

// procAttr puts the broker in a process group of its own (Pdeathsig is
// Linux's only).
func procAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
