package main

import "syscall"

// ownSession starts the demo's redis-server in a session of its own, out of
// the terminal's reach, and kills it if the demo dies first.
func ownSession() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
}
