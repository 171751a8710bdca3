//go:build unix && !linux

package main

import "syscall"

// ownSession starts the demo's redis-server in a session of its own, out of
// the terminal's reach (Pdeathsig is Linux's only).
func ownSession() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setsid: true}
}
