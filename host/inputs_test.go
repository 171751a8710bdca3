package host_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/internal/vector"
	"github.com/backstop-dev/backstop/policy"
)

// inputsFile reads testdata/vectors/inputs.json: bad (and odd) inputs with
// the answer every host gives.
func inputsFile(t *testing.T) vector.InputsFile {
	t.Helper()
	b, err := os.ReadFile("../testdata/vectors/inputs.json")
	if err != nil {
		t.Fatal(err)
	}
	var f vector.InputsFile
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	return f
}

// inputsPolicy is the shared input cases and their policy, loaded into
// the shared runtime (closed when the test ends).
func inputsPolicy(t *testing.T) (vector.InputsFile, *host.Policy) {
	t.Helper()
	f := inputsFile(t)
	p, err := runtime(t).Load(context.Background(), []byte(f.Policy))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	return f, p
}

func answer(d policy.Decision, err error) string {
	return strings.TrimSuffix(string(vector.Answer(d, err)), "\n")
}

// The shared input cases a Go caller can express (as a policy.Failure)
// get the shared answer through backstop.wasm, with Decide and, between
// two valid failures, with DecideBatch: a bad entry yields its own error
// and does not stop the batch.
func TestSharedInputs(t *testing.T) {
	f, p := inputsPolicy(t)
	ctx := context.Background()
	good := policy.Failure{Attempt: 2, HTTPStatus: 503, Random: 0.5}
	goodAnswer := answer(p.Decide(ctx, good))
	n := 0
	for i, c := range f.Cases {
		var in vector.Input
		var err error
		switch {
		case c.Line != nil:
			in, err = vector.DecodeLine([]byte(*c.Line))
		case c.Value != nil:
			var v any
			dec := json.NewDecoder(strings.NewReader(string(c.Value)))
			dec.UseNumber()
			if err := dec.Decode(&v); err != nil {
				t.Fatal(err)
			}
			in, err = vector.FromValue(vector.Revive(v))
		default:
			continue
		}
		if err != nil {
			continue // the value is no policy.Failure: nothing reaches the host
		}
		n++
		if got := answer(p.Decide(ctx, in.Failure())); got != c.Output {
			t.Errorf("case %d (%s): Decide:\n got %.200s\nwant %.200s", i, c.Note, got, c.Output)
		}
		ds, err := p.DecideBatch(ctx, []policy.Failure{good, in.Failure(), good}, nil)
		if len(ds) != 3 || answer(ds[0], nil) != goodAnswer || answer(ds[2], nil) != goodAnswer {
			t.Errorf("case %d: DecideBatch around it: %v, %v", i, ds, err)
			continue
		}
		if got := answer(ds[1], err); got != c.Output || (err != nil && !strings.HasPrefix(err.Error(), "failures[1]: ")) {
			t.Errorf("case %d (%s): DecideBatch:\n got %.200s (%v)\nwant %.200s", i, c.Note, got, err, c.Output)
		}
	}
	if n < 80 {
		t.Fatalf("only %d cases reached the host", n)
	}
}

// The host's own checks (what does not fit the ABI) give the shared
// answers for the same values, in Decide and per entry in DecideBatch.
func TestHostChecksMatchTheSharedInputs(t *testing.T) {
	outputs := map[string]string{}
	for _, c := range inputsFile(t).Cases {
		if c.Line != nil {
			outputs[*c.Line] = c.Output
		}
	}
	long := func(n int) string { return strings.Repeat("x", n) }
	ctx := context.Background()
	p, err := runtime(t).Load(ctx, []byte("default"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	for _, c := range []struct {
		f    policy.Failure
		line string // the same failure in inputs.json
	}{
		{policy.Failure{Attempt: 2, Random: 0.5, HTTPStatus: 1 << 31}, `{"attempt":2,"random":0.5,"http_status":2147483648}`},
		{policy.Failure{Attempt: 2, Random: 0.5, HTTPStatus: -1<<31 - 1}, `{"attempt":2,"random":0.5,"http_status":-2147483649}`},
		{policy.Failure{Attempt: 2, Random: 0.5, HTTPStatus: 1e10, ErrorKind: "5"}, `{"attempt":2,"http_status":1e10,"error_kind":5}`},
		{policy.Failure{Attempt: 2, Random: 0.5, GRPCCode: 1 << 31}, `{"attempt":2,"grpc_code":2147483648,"random":0.5}`},
		{policy.Failure{Attempt: 2, Random: 0.5, ErrorKind: long(65536)}, `{"attempt":2,"error_kind":"` + long(65536) + `","random":0.5}`},
		{policy.Failure{Attempt: 1, HTTPStatus: 429, Random: 0.5, RetryAfter: long(65536)}, `{"attempt":1,"http_status":429,"random":0.5,"retry_after":"` + long(65536) + `"}`},
		{policy.Failure{Attempt: 1, GRPCCode: 14, Random: 0.5, RetryPushback: strings.Repeat("1", 65536)}, `{"attempt":1,"grpc_code":14,"random":0.5,"grpc_retry_pushback_ms":"` + strings.Repeat("1", 65536) + `"}`},
		{policy.Failure{Attempt: 2, HTTPStatus: 503, Random: 0.5, Method: long(65536)}, `{"attempt":2,"http_status":503,"random":0.5,"method":"` + long(65536) + `"}`},
		{policy.Failure{Attempt: 2, Method: long(70000), IdempotencyKey: "0"}, `{"attempt":2,"method":"` + long(70000) + `","idempotency_key":0}`},
		{policy.Failure{Attempt: 0, HTTPStatus: 1 << 40}, ""}, // the host's check comes before the module's
	} {
		want, ok := outputs[c.line]
		if c.line == "" {
			want = `{"error":"http_status: must be a 32-bit integer (got 1099511627776)"}`
		} else if !ok {
			t.Fatalf("inputs.json has no line %.100s", c.line)
		}
		_, err := p.Decide(ctx, c.f)
		var ie *policy.InputError
		if !errors.As(err, &ie) || answer(policy.Decision{}, err) != want {
			t.Errorf("%.100s: Decide: %v, want %s", c.line, err, want)
		}
		ok2 := policy.Failure{Attempt: 1, HTTPStatus: 503}
		ds, err := p.DecideBatch(ctx, []policy.Failure{ok2, c.f, ok2, c.f}, nil)
		if len(ds) != 4 || ds[0].Action != policy.Retry || ds[2].Action != policy.Retry || ds[1] != (policy.Decision{}) {
			t.Errorf("%.100s: DecideBatch decisions %v", c.line, ds)
		}
		if !errors.As(err, &ie) || answer(policy.Decision{}, err) != want || !strings.HasPrefix(err.Error(), "failures[1]: ") {
			t.Errorf("%.100s: DecideBatch: %v, want %s", c.line, err, want)
		}
	}
}

// A stateful policy counts exactly the valid failures of a batch, in order:
// a bad entry is skipped, whichever check refuses it.
func TestDecideBatchCountsOnlyValidFailures(t *testing.T) {
	ctx := context.Background()
	const t0 = 1767225600000
	bad := []policy.Failure{
		{Attempt: 1, HTTPStatus: 1 << 40, NowMs: t0},
		{Attempt: 1, Method: strings.Repeat("x", 70_000), NowMs: t0},
		{Attempt: 1, RetryAfter: strings.Repeat("9", 70_000), NowMs: t0},
		{Attempt: 0, NowMs: t0},
	}
	var fs []policy.Failure
	for i := range 30 {
		if i%3 == 1 {
			fs = append(fs, bad[i/3%len(bad)])
		} else {
			fs = append(fs, policy.Failure{Attempt: 1 + int64(i%4), HTTPStatus: 503, Random: 0.5, NowMs: t0 + 1000*int64(i)})
		}
	}
	batch, _ := runtime(t).Load(ctx, []byte(statefulPolicy))
	one, _ := runtime(t).Load(ctx, []byte(statefulPolicy))
	defer batch.Close(ctx)
	defer one.Close(ctx)
	ds, err := batch.DecideBatch(ctx, fs, nil)
	var ie *host.InputError
	if !errors.As(err, &ie) || ie.Index != 1 {
		t.Fatalf("DecideBatch: %v", err)
	}
	for i, f := range fs {
		want := policy.Decision{}
		if i%3 != 1 {
			want, _ = one.Decide(ctx, f)
		}
		if ds[i] != want {
			t.Errorf("failure %d: %v, want %v", i, ds[i], want)
		}
	}
}
