package idempotency_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/backstop-dev/backstop/idempotency"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
)

func TestSafeHeader(t *testing.T) {
	for _, c := range []struct{ name, value, want string }{
		{"Location", "/orders/€42", "/orders/%E2%82%AC42"},
		{"Location", "/charges/☃", "/charges/%E2%98%83"},
		{"Location", "/charges/1\x01", "/charges/1%01"},
		{"X-Split", "a\r\nSet-Cookie: x=1", "a%0D%0ASet-Cookie: x=1"},
		{"X-Trim", " \t padded value\t ", "padded value"},
		{"X-Spaces", "a  b", "a%20%20b"},
		{"X-Spaces", "a\tb", "a\tb"},
		{"X-Visible", `100%25 ok; q="x"`, `100%25 ok; q="x"`},
		{"X-Latin1", "caf\xe9", "caf%E9"},
		{"X-Del", "a\x7fb", "a%7Fb"},
		{"X-Empty", "", ""},
		{"X-Blank", " \t ", ""},
	} {
		got, ok := idempotency.SafeHeader(c.name, c.value)
		if !ok || got != c.want {
			t.Errorf("SafeHeader(%q, %q) = %q, %v; want %q", c.name, c.value, got, ok, c.want)
		}
		if again, _ := idempotency.SafeHeader(c.name, got); again != got {
			t.Errorf("SafeHeader twice on %q: %q, want it unchanged", got, again)
		}
	}
	for _, name := range []string{"", "X Odd:Name", "X-Odd:Name", "Bad\r\nName", "Ünicode", "a/b", "(x)"} {
		if _, ok := idempotency.SafeHeader(name, "v"); ok {
			t.Errorf("SafeHeader(%q): a name that is not a token was kept", name)
		}
	}
	if _, ok := idempotency.SafeHeader("!#$%&'*+-.^_`|~09azAZ", "v"); !ok {
		t.Error("every token character: the name was dropped")
	}
}

func ExampleSafeHeader() {
	v, ok := idempotency.SafeHeader("Location", "/orders/€42")
	fmt.Println(v, ok)
	_, ok = idempotency.SafeHeader("X Odd:Name", "v")
	fmt.Println(ok)
	// Output:
	// /orders/%E2%82%AC42 true
	// false
}

// A header name that cannot be stored is dropped and logged once per name.
func TestCompleteDropsAndLogsBadNamesOnce(t *testing.T) {
	log := &logs{}
	store := idempotency.New(redistest.Start(t).Client(), idempotency.WithMetrics(idempotency.NewMetrics()), idempotency.WithLogger(log.logger()))
	ctx := context.Background()
	for _, key := range []string{"k1", "k2"} {
		c, err := store.Begin(ctx, "", key, "r")
		if err != nil {
			t.Fatal(err)
		}
		resp := idempotency.Response{Status: 201, Headers: map[string][]string{"X Logged:Once": {"v"}, "Location": {"/orders/€42"}}}
		if err := store.Complete(ctx, "", key, c.Token, resp); err != nil {
			t.Fatal(err)
		}
		c, err = store.Begin(ctx, "", key, "r")
		if err != nil || fmt.Sprint(c.Response.Headers) != "map[Location:[/orders/%E2%82%AC42]]" {
			t.Errorf("replay: %v %v", c.Response, err)
		}
	}
	if n := strings.Count(log.String(), `name="X Logged:Once"`); n != 1 {
		t.Errorf("log %q: the dropped name logged %d times, want once", log.String(), n)
	}
}
