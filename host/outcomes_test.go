package host_test

import (
	"context"
	"encoding/json"
	"os"
	"reflect"
	"testing"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/vector"
	"github.com/backstop-dev/backstop/policy"
)

// TestOutcomeCases replays testdata/outcomes through the native core
// (backstop.Native) and backstop.wasm (host.Policy), each on a fresh policy
// per case: both give every step's outcome and error.
func TestOutcomeCases(t *testing.T) {
	b, err := os.ReadFile("../testdata/outcomes/cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var file vector.OutcomesFile
	if err := json.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	if file.ABIVersion != 1 || file.OpenPollMs != policy.OpenPollMs || len(file.Cases) == 0 {
		t.Fatalf("cases for ABI version %d, open_poll_ms %d, %d cases", file.ABIVersion, file.OpenPollMs, len(file.Cases))
	}
	ctx := context.Background()
	rt := runtime(t)
	steps := 0
	for _, c := range file.Cases {
		np, err := policy.Load(c.PolicyBytes())
		if err != nil {
			t.Fatalf("case %s: %v", c.Name, err)
		}
		hp, err := rt.Load(ctx, c.PolicyBytes())
		if err != nil {
			t.Fatalf("case %s: %v", c.Name, err)
		}
		for name, d := range map[string]backstop.Decider{"native": backstop.Native(np), "wasm": hp} {
			if d.Stateful() != c.Stateful {
				t.Errorf("%s: case %s: Stateful() = %v", name, c.Name, d.Stateful())
			}
			for i, want := range c.Steps {
				e, err := want.JobEvent()
				if err != nil {
					t.Fatalf("case %s step %d: %v", c.Name, i, err)
				}
				got := want
				got.Answer(d.Outcome(ctx, e))
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("%s: case %s step %d (%s): got %s, want %s", name, c.Name, i, want.Event, show(got), show(want))
				}
				steps++
			}
		}
		hp.Close(ctx)
	}
	t.Logf("%d steps replayed", steps)
}

func show(s vector.OutcomeStep) string {
	b, _ := json.Marshal(struct {
		Expect *vector.OutcomeExpect `json:"expect"`
		Error  string                `json:"error"`
	}{s.Expect, s.Error})
	return string(b)
}
