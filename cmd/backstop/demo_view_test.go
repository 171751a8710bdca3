package main

import (
	"flag"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// Issue 42: at 80 columns every figure of the live view fits on its line
// (the outage status line alone was 159 characters); from 100 the policy
// shows too; a longer line is cut, never wrapped.
func TestDemoViewFitsTheTerminal(t *testing.T) {
	figures := []string{"1000000", "999999", "123456", "12345", "12345", "1234", "123456"}
	for _, c := range []struct {
		cols   int
		policy bool
	}{{80, false}, {99, false}, {100, true}, {0, true}} {
		tb := newDemoTable(c.cols)
		tb.row("queue", "policy", demoColumns, "")
		tb.row("demo-payments", "payments", figures, "")
		tb.row(" render_report", "send_email", figures, "")
		for _, l := range strings.Split(strings.TrimSuffix(tb.b.String(), "\n"), "\n") {
			if c.cols > 0 && utf8.RuneCountInString(l) > c.cols-1 {
				t.Errorf("%d columns: %d-column line %q", c.cols, utf8.RuneCountInString(l), l)
			}
			if strings.Contains(l, " payments ") != c.policy && strings.HasPrefix(l, "demo-payments") {
				t.Errorf("%d columns: policy shown %v: %q", c.cols, !c.policy, l)
			}
		}
		for _, h := range demoColumns {
			if !strings.Contains(tb.b.String(), " "+h) {
				t.Errorf("%d columns: no column %q", c.cols, h)
			}
		}
	}
	if got := fitLine(strings.Repeat("x", 200), 79); utf8.RuneCountInString(got) != 79 || !strings.HasSuffix(got, "…") {
		t.Errorf("fitLine: %q", got)
	}
	if got := fitLine("short", 79); got != "short" {
		t.Errorf("fitLine: %q", got)
	}
	if got := fitLine(strings.Repeat("x", 200), -1); len(got) != 200 {
		t.Error("fitLine cut a line with no terminal")
	}
}

// Issue 42: the demo's exporter answers /metrics and 404 on any other path
// (it answered any path), and listens on this machine only by default.
func TestDemoMetricsEndpoint(t *testing.T) {
	h := demoMetricsHandler(prometheus.NewRegistry())
	for path, want := range map[string]int{"/metrics": 200, "/": 404, "/anything": 404, "/metricsx": 404} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != want {
			t.Errorf("%s: %d, want %d", path, rec.Code, want)
		}
	}
	runCLI(t, "", "demo", "-h")
	v, _ := flagSets.Load("demo")
	if def := v.(*flag.FlagSet).Lookup("listen").DefValue; def != "127.0.0.1:9797" {
		t.Errorf("--listen defaults to %q, want 127.0.0.1:9797", def)
	}
}
