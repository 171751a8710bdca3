package host_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"testing"

	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/internal/vector"
	"github.com/backstop-dev/backstop/policy"
)

// expect converts a host result to the vector shape. The host's
// *InputError converts to the native *policy.InputError, whose field and
// reason the vectors record.
func expect(d policy.Decision, err error) vector.Expect {
	var ie *policy.InputError
	if errors.As(err, &ie) {
		err = ie
	}
	return vector.FromDecision(d, err)
}

// TestVectors replays the shared vectors through backstop.wasm, one by one
// with Decide and, on a fresh policy, in batches with DecideBatch.
func TestVectors(t *testing.T) {
	b, err := os.ReadFile("../testdata/vectors/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var file vector.File
	if err := json.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	if file.ABIVersion != 1 {
		t.Fatalf("vectors are for ABI version %d", file.ABIVersion)
	}
	ctx := context.Background()
	rt := runtime(t)
	for _, g := range file.Groups {
		scalar, err := rt.Load(ctx, g.PolicyBytes())
		if err != nil {
			t.Fatalf("group %s: %v", g.Name, err)
		}
		batch, _ := rt.Load(ctx, g.PolicyBytes())
		if scalar.Stateful() != g.Stateful {
			t.Errorf("group %s: Stateful() = %v", g.Name, scalar.Stateful())
		}
		var pending []vector.Case // decisions since the last success, for one batch
		flush := func() {
			fs := make([]policy.Failure, len(pending))
			for i, c := range pending {
				fs[i] = c.Input.Failure()
			}
			ds, err := batch.DecideBatch(ctx, fs, nil)
			var ie *policy.InputError
			for i, c := range pending {
				got := vector.FromDecision(ds[i], nil)
				if c.Expect.Error != "" {
					if !errors.As(err, &ie) { // only the first bad one is named
						t.Errorf("group %s: batch: no error for a bad input", g.Name)
					}
					continue
				}
				if got != *c.Expect {
					t.Errorf("group %s: batch: got %+v, want %+v", g.Name, got, *c.Expect)
				}
			}
			pending = pending[:0]
		}
		for i, c := range g.Cases {
			switch c.Op {
			case "success":
				flush()
				if scalar.RecordSuccess(ctx, c.NowMs) != nil || batch.RecordSuccess(ctx, c.NowMs) != nil {
					t.Fatal("RecordSuccess failed")
				}
				continue
			case "duration":
				flush()
				if scalar.RecordDuration(ctx, c.NowMs, c.DurationMs) != nil || batch.RecordDuration(ctx, c.NowMs, c.DurationMs) != nil {
					t.Fatal("RecordDuration failed")
				}
				continue
			case "acquire":
				flush()
				for _, p := range []*host.Policy{scalar, batch} {
					pm, err := p.Acquire(ctx, c.NowMs)
					if got := vector.FromPermit(pm); err != nil || got != *c.Permit {
						t.Errorf("group %s case %d: acquire at %d\n got %+v (%v)\nwant %+v", g.Name, i, c.NowMs, got, err, *c.Permit)
					}
				}
				continue
			case "connect_timeout":
				for _, p := range []*host.Policy{scalar, batch} {
					if got := p.ConnectTimeoutMs(); c.TimeoutMs == nil || got != *c.TimeoutMs {
						t.Errorf("group %s case %d: connect_timeout: got %d, want %s", g.Name, i, got, c.TimeoutAnswer())
					}
				}
				continue
			case "attempt_timeout":
				for _, p := range []*host.Policy{scalar, batch} {
					var got vector.Case
					got.FromTimeout(p.AttemptTimeout(ctx, c.ElapsedMs))
					if got.TimeoutAnswer() != c.TimeoutAnswer() {
						t.Errorf("group %s case %d: attempt_timeout at %d: got %s, want %s", g.Name, i, c.ElapsedMs, got.TimeoutAnswer(), c.TimeoutAnswer())
					}
				}
				continue
			}
			got := expect(scalar.Decide(ctx, c.Input.Failure()))
			if got != *c.Expect {
				in, _ := json.Marshal(c.Input)
				t.Errorf("group %s case %d: input %s\n got %+v\nwant %+v", g.Name, i, in, got, *c.Expect)
			}
			pending = append(pending, c)
		}
		flush()
		scalar.Close(ctx)
		batch.Close(ctx)
	}
}
