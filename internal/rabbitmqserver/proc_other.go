//go:build !unix

package rabbitmqserver

import (
	"os"
	"syscall"
)

// Without Unix signals (Windows, where rabbitmq-server is not the Debian
// package this launcher drives) a broker can only be killed.

func procAttr() *syscall.SysProcAttr { return nil }

func signal(p *os.Process, _ syscall.Signal) { _ = p.Kill() }

func killGroup(p *os.Process) { _ = p.Kill() }
