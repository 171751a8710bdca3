//go:build !unix

package main

import "syscall"

// ownSession: no sessions here; the console's Ctrl-C reaches the server too.
func ownSession() *syscall.SysProcAttr { return nil }
