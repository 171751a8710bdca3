package rabbitmqserver

import "syscall"

// procAttr puts the broker in a process group of its own (so killGroup
// reaches its helpers) and kills it if this process dies first: a test
// binary or a demo killed with SIGKILL leaves no broker behind.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
