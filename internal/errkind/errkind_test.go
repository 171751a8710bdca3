package errkind

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/backstop-dev/backstop/policy"
)

// Every row of errorkinds.json that Go follows gives its kind, on errors
// made the way the standard library makes them (a real dial where one can
// be made without waiting).
func TestErrorKindsTable(t *testing.T) {
	var table struct {
		Codes map[string]string
		Go    [][2]string
	}
	if err := json.Unmarshal(errorKindsJSON, &table); err != nil {
		t.Fatal(err)
	}
	kind := func(err error) string {
		var f policy.Failure
		Classify(err, &f)
		return f.ErrorKind
	}
	expired, cancel := context.WithDeadline(context.Background(), time.Unix(0, 0))
	defer cancel()
	// A port nothing listens on: refused at once.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	_, refused := net.Dial("tcp", closed)
	_, dialTimeout := (&net.Dialer{}).DialContext(expired, "tcp", "127.0.0.1:1")
	read := func(errno syscall.Errno) error {
		return &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", errno)}
	}
	rows := map[string][]error{
		"*net.OpError dial, timeout":         {dialTimeout, &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}},
		"context.DeadlineExceeded":           {expired.Err(), fmt.Errorf("call: %w", context.DeadlineExceeded)},
		"*net.DNSError temporary or timeout": {&net.DNSError{Err: "try again", Name: "x", IsTemporary: true}, &net.DNSError{Err: "timeout", Name: "x", IsTimeout: true}},
		"*net.DNSError":                      {&net.DNSError{Err: "no such host", Name: "x.invalid", IsNotFound: true}},
		"net.Error timeout":                  {&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}},
	}
	for _, row := range table.Go {
		if row[1] == "codes" {
			for name, want := range table.Codes {
				errno, ok := errnoNames[name]
				if !ok {
					continue // Node's or getaddrinfo's, not an errno in Go
				}
				if got := kind(read(errno)); got != want {
					t.Errorf("%s: %q, want %q", name, got, want)
				}
			}
			if got := kind(refused); got != table.Codes["ECONNREFUSED"] {
				t.Errorf("a real refused dial (%v): %q, want %q", refused, got, table.Codes["ECONNREFUSED"])
			}
			continue
		}
		errs, ok := rows[row[0]]
		if !ok {
			t.Errorf("row %q: no error made for it here", row[0])
		}
		for _, e := range errs {
			if got := kind(e); got != row[1] {
				t.Errorf("row %q, %T %v: %q, want %q", row[0], e, e, got, row[1])
			}
		}
		delete(rows, row[0])
	}
	for name := range rows {
		t.Errorf("%q is not a row of errorkinds.json", name)
	}
	if got := kind(errors.New("something else")); got != "" {
		t.Errorf("another error: %q, want none", got)
	}
	// errnoNames covers every errno the table names.
	for name := range table.Codes {
		if _, ok := errnoNames[name]; !ok && name[0] == 'E' && name != "EAI_AGAIN" && name != "ENOTFOUND" {
			t.Errorf("code %s: an errno Go does not map (errnoNames)", name)
		}
	}
}
