package main

import (
	"context"
	"strings"
	"testing"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// demo-reports carries three job types, each decided by its own policy:
// charge_card gives up after its policy's 3 attempts (the queue's allows
// 8), and the live view shows a line per type.
func TestDemoJobTypes(t *testing.T) {
	srv := redistest.Start(t)
	out, err := runCLI(t, "", "demo", "--jobs", "600", "--listen", "127.0.0.1:0", "--redis.url", "redis://"+srv.Addr+"/0")
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	for _, want := range []string{" charge_card    charge_card", " send_email     send_email", " render_report  reports"} {
		if !strings.Contains(out, want) {
			t.Errorf("the live view lacks %q:\n%s", want, out)
		}
	}
	s, err := redisqueue.New(srv.Client(), "demo-reports").Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	by := s.Types.ByType
	var typed int64
	for _, typ := range []string{"charge_card", "send_email", "render_report"} {
		c := by[typ]
		typed += c["attempts:success"] + c["attempts:dead_letter"]
		for f, n := range c {
			if typ == "charge_card" && strings.HasPrefix(f, "finished:") && n > 0 && !strings.HasSuffix(f, ":1") &&
				!strings.HasSuffix(f, ":2") && !strings.HasSuffix(f, ":3") {
				t.Errorf("charge_card %s = %d: its policy allows 3 attempts", f, n)
			}
		}
	}
	if typed != 200 || s.Types.Registered != 3 || by["charge_card"]["attempts:dead_letter"] <= by["send_email"]["attempts:dead_letter"] {
		t.Fatalf("per-type counters: %+v (want 200 jobs finished over the three types, charge_card failing most)", s.Types)
	}
}
