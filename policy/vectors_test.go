package policy_test

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/backstop-dev/backstop/internal/vector"
	"github.com/backstop-dev/backstop/policy"
)

func loadVectors(t testing.TB) vector.File {
	t.Helper()
	b, err := os.ReadFile("../testdata/vectors/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var f vector.File
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestVectors replays every shared vector through the native core. The wasm
// hosts replay the same file; together they prove identical decisions.
func TestVectors(t *testing.T) {
	f := loadVectors(t)
	n := 0
	for _, g := range f.Groups {
		p, err := policy.Load(g.PolicyBytes())
		if err != nil {
			t.Fatalf("group %s: %v", g.Name, err)
		}
		if p.Stateful() != g.Stateful {
			t.Errorf("group %s: Stateful() = %v, vector says %v", g.Name, p.Stateful(), g.Stateful)
		}
		for i, c := range g.Cases {
			switch c.Op {
			case "success":
				p.RecordSuccess(c.NowMs)
				continue
			case "duration":
				if err := p.RecordDuration(c.NowMs, c.DurationMs); err != nil {
					t.Errorf("group %s case %d: %v", g.Name, i, err)
				}
				continue
			case "acquire":
				if got := vector.FromPermit(p.Acquire(c.NowMs)); got != *c.Permit {
					t.Errorf("group %s case %d: acquire at %d\n got %+v\nwant %+v", g.Name, i, c.NowMs, got, *c.Permit)
				}
				continue
			case "connect_timeout":
				if got := p.ConnectTimeoutMs(); c.TimeoutMs == nil || got != *c.TimeoutMs {
					t.Errorf("group %s case %d: connect_timeout: got %d, want %s", g.Name, i, got, c.TimeoutAnswer())
				}
				continue
			case "attempt_timeout":
				var got vector.Case
				got.FromTimeout(p.AttemptTimeout(c.ElapsedMs))
				if got.TimeoutAnswer() != c.TimeoutAnswer() {
					t.Errorf("group %s case %d: attempt_timeout at %d: got %s, want %s", g.Name, i, c.ElapsedMs, got.TimeoutAnswer(), c.TimeoutAnswer())
				}
				continue
			}
			got := vector.FromDecision(p.Decide(c.Input.Failure()))
			if got != *c.Expect {
				in, _ := json.Marshal(c.Input)
				t.Errorf("group %s case %d: input %s\n got %+v\nwant %+v", g.Name, i, in, got, *c.Expect)
			}
			n++
		}
	}
	if n < 1000 {
		t.Errorf("only %d decision vectors; the contract asks for at least 1000", n)
	}
}
