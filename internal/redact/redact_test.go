package redact_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/backstop-dev/backstop/internal/redact"
)

func TestURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"redis://cache:6379/0", "redis://cache:6379/0"},
		{"redis://app:s3cret@cache:6379/0", "redis://app:xxxxx@cache:6379/0"},
		{"redis://:s3cret@cache:6379", "redis://:xxxxx@cache:6379"},
		{"redis://s3cret@cache:6379", "redis://xxxxx@cache:6379"}, // go-redis: a lone user is the password
		{"amqp://app:p%25ss@rabbit:5672/vh", "amqp://app:xxxxx@rabbit:5672/vh"},
		{"http://am:p@ss@alertmanager:9093", "http://am:xxxxx@alertmanager:9093"},
		// Unparseable: an unescaped %, a space, a bad port.
		{"redis://app:50%off@cache:6379", "redis://" + redact.Unparseable},
		{"amqp://app:pa ss@rabbit:5672/", "amqp://" + redact.Unparseable},
		{"http://am:s3cret@alertmanager:port", "http://" + redact.Unparseable},
		// The "@" fell out of the host part: a / ? or # in the password.
		{"redis://app:12/ab@cache:6379", "redis://" + redact.Unparseable},
		{"redis://app:12?ab@cache:6379", "redis://" + redact.Unparseable},
		{"redis://app:12#ab@cache:6379", "redis://" + redact.Unparseable},
		// No scheme to show.
		{"app:s3cret@cache:6379", redact.Unparseable},
		{"1x://app:50%off@cache", redact.Unparseable},
	} {
		if got := redact.URL(tc.in); got != tc.want {
			t.Errorf("URL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// A parse error of net/url quotes the URL and the bad escape (part of the
// password): Error keeps neither, and says what to do.
func TestErrorParse(t *testing.T) {
	for _, tc := range []struct{ raw, secret string }{
		{"redis://app:50%off@cache:6379", "50%off"},
		{"redis://app:pa ss@cache:6379", "pa ss"},
		{"http://am:s3cr3t@alertmanager:port", "s3cr3t"},
		{"amqp://app:x%zzy@rabbit/", "x%zzy"},
	} {
		_, perr := url.Parse(tc.raw)
		if perr == nil {
			t.Fatalf("%q parsed", tc.raw)
		}
		err := redact.Error(fmt.Errorf("--redis-url: %w", perr)) // found in the chain, without urls
		msg := err.Error()
		for _, leak := range []string{tc.secret, tc.secret[:3], tc.raw} {
			if strings.Contains(msg, leak) {
				t.Errorf("error %q shows %q", msg, leak)
			}
		}
		scheme, _, _ := strings.Cut(tc.raw, "://")
		if want := "--redis-url: " + scheme + "://" + redact.Unparseable + ": not a valid URL: percent-encode"; !strings.HasPrefix(msg, want) {
			t.Errorf("error %q, want it to start with %q", msg, want)
		}
	}
}

// A client library's error that embeds the URL, or its password alone,
// escaped or decoded, plain or quoted.
func TestErrorScrubs(t *testing.T) {
	raw := "amqp://app:p%40ss%22word@rabbit:5672/"
	for _, text := range []string{
		"dial " + raw + ": refused",
		fmt.Sprintf("dial %q: refused", raw),
		"login as app with p%40ss%22word refused",
		`login as app with p@ss"word refused`,
		fmt.Sprintf("login %q refused", `p@ss"word`),
	} {
		msg := redact.Error(errors.New(text), raw).Error()
		for _, leak := range []string{"p%40ss", "p@ss", `ss"word`, `ss\"word`} {
			if strings.Contains(msg, leak) {
				t.Errorf("%q became %q, which shows %q", text, msg, leak)
			}
		}
		if !strings.Contains(msg, "xxxxx") {
			t.Errorf("%q became %q: nothing masked", text, msg)
		}
	}
	// Unparseable: the userinfo, and the password alone.
	bad := "redis://app:50%off@cache:6379"
	for _, text := range []string{"x " + bad + " y", "auth app:50%off failed", "password 50%off refused"} {
		if msg := redact.Error(errors.New(text), bad).Error(); strings.Contains(msg, "50%off") {
			t.Errorf("%q became %q", text, msg)
		}
	}
}

func TestErrorKeepsIdentity(t *testing.T) {
	if redact.Error(nil, "redis://a:b@c") != nil {
		t.Error("Error(nil) is not nil")
	}
	plain := errors.New("dial tcp 127.0.0.1:1: connection refused")
	if got := redact.Error(plain, "redis://app:s3cret@127.0.0.1:1"); got != plain {
		t.Errorf("an error without secrets was replaced: %v", got)
	}
	wrapped := fmt.Errorf("open redis://app:s3cret@cache: %w", context.DeadlineExceeded)
	got := redact.Error(wrapped, "redis://app:s3cret@cache")
	if !errors.Is(got, context.DeadlineExceeded) {
		t.Errorf("errors.Is lost through Error: %v", got)
	}
	if errors.Unwrap(got) != nil {
		t.Errorf("Error's result unwraps to the original text: %v", errors.Unwrap(got))
	}
	if want := "open redis://app:xxxxx@cache: context deadline exceeded"; got.Error() != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func ExampleURL() {
	fmt.Println(redact.URL("redis://app:s3cret@cache:6379/0"))
	fmt.Println(redact.URL("redis://app:50%off@cache:6379/0"))
	// Output:
	// redis://app:xxxxx@cache:6379/0
	// redis://<unparseable URL redacted>
}
