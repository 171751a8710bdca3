package casetest

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
)

func TestNative(t *testing.T) {
	var dns *net.DNSError
	for kind, is := range map[string]func(error) bool{
		"connection_refused": func(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) },
		"connection_reset":   func(err error) bool { return errors.Is(err, syscall.ECONNRESET) },
		"connect_timeout":    func(err error) bool { var ne net.Error; return errors.As(err, &ne) && ne.Timeout() },
		"timeout":            func(err error) bool { return errors.Is(err, context.DeadlineExceeded) },
		"dns_temporary":      func(err error) bool { return errors.As(err, &dns) && dns.IsTemporary },
		"dns_not_found":      func(err error) bool { return errors.As(err, &dns) && dns.IsNotFound },
	} {
		err := Native(t, "the case's text", kind)
		if err.Error() != "the case's text" || !is(err) {
			t.Errorf("Native(%s) = %v (%#v): not the case's text over Go's own error", kind, err, errors.Unwrap(err))
		}
	}
}
