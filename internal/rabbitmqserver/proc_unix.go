//go:build unix

package rabbitmqserver

import (
	"os"
	"syscall"
)

// signal sends sig to the broker's VM.
func signal(p *os.Process, sig syscall.Signal) { _ = syscall.Kill(p.Pid, sig) }

// killGroup ends the broker's whole process group: a VM that ignored
// SIGTERM, and its helpers (erl_child_setup and friends).
func killGroup(p *os.Process) { _ = syscall.Kill(-p.Pid, syscall.SIGKILL) }
