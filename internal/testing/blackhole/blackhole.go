//go:build unix

// Package blackhole gives tests a peer on loopback that never completes a
// connect: a listening socket with a backlog of 0 whose accept queue is
// full and never drained. The kernel drops further SYNs, so a client's
// connect hangs until its own connect timeout, as with a dependency behind
// a black-holing firewall, offline and without a non-routable address
// (which may fail at once with "network unreachable" instead).
package blackhole

import (
	"errors"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// Addr returns host:port of a listener whose next connect hangs. The
// socket and the connections filling its queue are closed by t.Cleanup.
func Addr(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	// Never accepted: backlog 0 holds one connection, then SYNs are dropped.
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	// Fill the queue until a connect hangs (one connection on Linux).
	for range 16 {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			t.Cleanup(func() { c.Close() })
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return addr
		}
		t.Fatalf("blackhole: filling %s: %v", addr, err)
	}
	t.Fatalf("blackhole: %s still accepts connections after 16", addr)
	return ""
}
