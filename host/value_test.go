package host_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/internal/abi"
	"github.com/backstop-dev/backstop/internal/failvalue"
	"github.com/backstop-dev/backstop/internal/vector"
	"github.com/backstop-dev/backstop/policy"
)

// decideValue is decide_value's answer as the shared output line.
func decideValue(t *testing.T, p *host.Policy, value []byte) string {
	t.Helper()
	w, msg, err := host.CallValue(context.Background(), p, -1, value, int32(len(value)), 0, 0)
	switch {
	case err != nil:
		t.Fatalf("decide_value trapped: %v", err)
	case w == abi.ErrInput:
		if !strings.HasPrefix(msg, "invalid failure: ") {
			t.Fatalf("decide_value: -3 with %q", msg)
		}
		return answer(policy.Decision{}, &host.InputError{Index: -1, Message: msg})
	case w < 0:
		t.Fatalf("decide_value = %d (%s)", w, msg)
	}
	return answer(abi.UnpackDecision(w), nil)
}

// caseValue is the failure value of an inputs.json case, as decide_value
// reads it, and the Input FromValue makes of it. ok is false for a line
// that holds no failure object (its error is the line's: blank, not JSON,
// past a limit): there is no value to pass.
func caseValue(t *testing.T, c vector.InputCase) (enc []byte, in vector.Input, err error, ok bool) {
	t.Helper()
	var src []byte
	switch {
	case c.Line != nil:
		src = []byte(*c.Line)
	case c.LineHex != "":
		src, _ = hex.DecodeString(c.LineHex)
	default:
		src = c.Value
	}
	if c.Value == nil {
		var le *vector.LineError
		if _, err := vector.DecodeLine(src); errors.As(err, &le) {
			return nil, vector.Input{}, nil, false
		}
	}
	dec := json.NewDecoder(strings.NewReader(string(src)))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	v = vector.Revive(v)
	enc, encErr := vector.EncodeValue(v)
	if encErr != nil {
		t.Fatal(encErr)
	}
	in, err = vector.FromValue(v)
	return enc, in, err, true
}

// Every shared input case that holds a failure value (every value case,
// every line that is a JSON object) gets its shared answer, byte for byte,
// from decide_value: the module's converter is the vectors'.
func TestDecideValueSharedInputs(t *testing.T) {
	f, p := inputsPolicy(t)
	n, lineErrors := 0, 0
	for i, c := range f.Cases {
		enc, _, _, ok := caseValue(t, c)
		if !ok {
			lineErrors++
			if !strings.HasPrefix(c.Output, `{"error":"invalid input line: `) {
				t.Errorf("case %d (%s): no value, but the output is %s", i, c.Note, c.Output)
			}
			continue
		}
		n++
		if got := decideValue(t, p, enc); got != c.Output {
			t.Errorf("case %d (%s): decide_value:\n got %.300s\nwant %.300s", i, c.Note, got, c.Output)
		}
	}
	if n+lineErrors != len(f.Cases) || n < 200 {
		t.Fatalf("%d cases reached decide_value, %d are line errors, of %d", n, lineErrors, len(f.Cases))
	}
}

// outcome_value answers as outcome does for every shared input: a valid
// failure's outcome, and an invalid one's word (the invalid bit) with the
// converter's or the policy's message.
func TestOutcomeValueSharedInputs(t *testing.T) {
	f, p := inputsPolicy(t)
	ctx := context.Background()
	invalid := 0
	for i, c := range f.Cases {
		enc, in, convErr, ok := caseValue(t, c)
		if !ok {
			continue
		}
		w, msg, err := host.CallValue(ctx, p, int32(policy.EventFailure), enc, int32(len(enc)), 1, 5)
		if err != nil || w < 0 {
			t.Fatalf("case %d: outcome_value = %d, %v (%s)", i, w, err, msg)
		}
		var want policy.Outcome
		var wantMsg string
		if convErr != nil {
			want, wantMsg = policy.Outcome{Action: policy.OutcomeDeadLetter, Reason: policy.Malformed,
				Count: policy.CountDeadLetter, Invalid: true}, convErr.Error()
		} else {
			var oerr error
			want, oerr = p.Outcome(ctx, policy.JobEvent{Event: policy.EventFailure, Failure: in.Failure(), Deliveries: 1, MaxDeliveries: 5})
			if oerr != nil {
				wantMsg = oerr.Error()
			}
		}
		if want.Invalid {
			invalid++
		}
		if got := abi.UnpackOutcome(w); got != want || msg != wantMsg {
			t.Errorf("case %d (%s): outcome_value = %+v %q, want %+v %q", i, c.Note, got, msg, want, wantMsg)
		}
	}
	if invalid < 100 {
		t.Fatalf("only %d invalid failures", invalid)
	}
	// The other events read now_ms only.
	for _, c := range []struct {
		event int32
		value map[string]any
		want  int64
		msg   string
	}{
		{int32(policy.EventBefore), map[string]any{"now_ms": 5}, abi.PackOutcome(policy.Outcome{Action: policy.OutcomeRun}), ""},
		{int32(policy.EventSuccess), map[string]any{"now_ms": 5, "attempt": 0}, abi.PackOutcome(policy.Outcome{Action: policy.OutcomeAck, Reason: policy.Success, Count: policy.CountSuccess}), ""},
		{int32(policy.EventBefore), map[string]any{"now_ms": -1}, abi.ErrInput, "invalid event: now_ms: must be >= 0 (got -1)"},
		{int32(policy.EventBefore), map[string]any{"now_ms": "soon"}, abi.ErrInput, "invalid failure: now_ms: must be an integer (got a string)"},
		{int32(policy.EventDelivered), map[string]any{}, abi.PackOutcome(policy.Outcome{Action: policy.OutcomeDeadLetter, Reason: policy.CrashLoop}), ""},
		{7, map[string]any{}, abi.ErrInput, "invalid event: event: must be 0 (before) to 3 (delivered) (got 7)"},
	} {
		enc, _ := failvalue.Append(nil, c.value)
		w, msg, err := host.CallValue(ctx, p, c.event, enc, int32(len(enc)), 5, 5)
		if err != nil || w != c.want || msg != c.msg {
			t.Errorf("event %d %v: %#x %q (%v), want %#x %q", c.event, c.value, w, msg, err, c.want, c.msg)
		}
	}
	// A malformed encoding is the host's mistake: an error code, for the
	// failure event too.
	w, msg, err := host.CallValue(ctx, p, int32(policy.EventFailure), []byte{abi.ValueObject, 1}, 2, 1, 5)
	if err != nil || w != abi.ErrInput || !strings.HasPrefix(msg, "invalid failure: value: ") {
		t.Errorf("malformed: %d %q %v", w, msg, err)
	}
}

// A malformed encoding, or a length outside the buffer, is -3 with a
// message naming "value"; the instance goes on.
func TestDecideValueMalformed(t *testing.T) {
	ctx := context.Background()
	p, err := runtime(t).Load(ctx, []byte("default"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	good, _ := failvalue.Append(nil, map[string]any{"attempt": 2, "http_status": 503, "random": 0.5})
	for _, c := range []struct {
		value []byte
		n     int32
		msg   string
	}{
		{nil, 0, "invalid failure: value: a value runs past the end at byte 0"},
		{[]byte{42}, 1, "invalid failure: value: unknown tag 42 at byte 0"},
		{[]byte{abi.ValueObject, 9, 0, 0, 0}, 5, "invalid failure: value: an object length 9 runs past the end at byte 1"},
		{[]byte{abi.ValueInt, 2, 0, 0, 0, '1', 'x'}, 7, "invalid failure: value: an integer is not a decimal integer at byte 7"},
		{[]byte{abi.ValueString, 1, 0, 0, 0, 0xff}, 6, "invalid failure: value: a string is not UTF-8 at byte 5"},
		{append(append([]byte{}, good...), 0), int32(len(good)) + 1, "invalid failure: value: 1 bytes after the value at byte " + strconv.Itoa(len(good))},
		{good, -1, "invalid failure: value: length -1 is outside the buffer"},
		{good, 1 << 30, "invalid failure: value: length 1073741824 is outside the buffer"},
	} {
		w, msg, err := host.CallValue(ctx, p, -1, c.value, c.n, 0, 0)
		if err != nil || w != abi.ErrInput || !strings.HasPrefix(msg, c.msg) {
			t.Errorf("%x (n %d): %d %q (%v), want -3 %q", c.value, c.n, w, msg, err, c.msg)
		}
	}
	if got := decideValue(t, p, good); got != `{"action":"retry","delay_ms":1000,"reason":"transient","class":"retryable"}` {
		t.Errorf("after the malformed ones: %s", got)
	}
}

// failureValue is f as a failure value, every field present.
func failureValue(t *testing.T, f policy.Failure) []byte {
	t.Helper()
	b, err := failvalue.Append(nil, map[string]any{
		"attempt": f.Attempt, "http_status": f.HTTPStatus, "grpc_code": f.GRPCCode, "error_kind": f.ErrorKind,
		"retry_after": f.RetryAfter, "grpc_retry_pushback_ms": f.RetryPushback, "method": f.Method,
		"idempotency_key": f.IdempotencyKey, "elapsed_ms": f.ElapsedMs, "now_ms": f.NowMs, "random": f.Random,
		"prev_delay_ms": f.PrevDelayMs, "retried_downstream": f.RetriedDownstream, "server_declined": f.ServerDeclined,
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A stateful policy counts decide_value exactly as decide, and
// outcome_value as outcome: the same decisions, budget and breaker, step
// by step, with invalid failures (refused by the converter or the policy)
// counted by neither.
func TestValueExportsCountAsDecide(t *testing.T) {
	ctx := context.Background()
	rt := runtime(t)
	load := func() *host.Policy {
		p, err := rt.Load(ctx, []byte(statefulPolicy))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close(ctx) })
		return p
	}
	plain, byValue, plainOut, byValueOut := load(), load(), load(), load()
	badType, _ := failvalue.Append(nil, map[string]any{"attempt": 1, "http_status": "503", "now_ms": 1_700_000_000_000})
	for i, f := range failures(7, 600) {
		if i%5 == 1 {
			f.Attempt = 0 // the policy refuses it
		}
		enc := failureValue(t, f)
		if i%11 == 3 {
			enc = badType // the converter refuses it
		}
		refused := i%11 == 3
		want := `{"error":"http_status: must be a 32-bit integer (got a string)"}`
		if !refused {
			want = answer(plain.Decide(ctx, f))
		}
		if got := decideValue(t, byValue, enc); got != want {
			t.Fatalf("failure %d: decide_value %s, decide %s", i, got, want)
		}
		wo, msg, err := host.CallValue(ctx, byValueOut, int32(policy.EventFailure), enc, int32(len(enc)), 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		o := policy.Outcome{Action: policy.OutcomeDeadLetter, Reason: policy.Malformed, Count: policy.CountDeadLetter, Invalid: true}
		oerr := errors.New("invalid failure: http_status: must be a 32-bit integer (got a string)")
		if !refused {
			o, oerr = plainOut.Outcome(ctx, policy.JobEvent{Event: policy.EventFailure, Failure: f, Deliveries: 1})
		}
		if got := abi.UnpackOutcome(wo); got != o || (oerr == nil) != (msg == "") || (oerr != nil && oerr.Error() != msg) {
			t.Fatalf("failure %d: outcome_value %+v %q, outcome %+v %v", i, got, msg, o, oerr)
		}
		if i%7 == 0 {
			for _, p := range []*host.Policy{plain, byValue, plainOut, byValueOut} {
				if err := p.RecordSuccess(ctx, f.NowMs); err != nil {
					t.Fatal(err)
				}
			}
		}
		a, _, _ := plain.BudgetTokens(ctx, f.NowMs)
		b, _, _ := byValue.BudgetTokens(ctx, f.NowMs)
		c, _, _ := byValueOut.BudgetTokens(ctx, f.NowMs)
		if a != b || a != c {
			t.Fatalf("failure %d: budget %d, by value %d, outcome by value %d", i, a, b, c)
		}
	}
}

// Arbitrary bytes (random, and valid encodings cut short or with a byte
// changed) never trap the instance: decide_value answers a decision or
// -3, outcome_value a word or -3.
func TestValueExportsNeverTrap(t *testing.T) {
	ctx := context.Background()
	p, err := runtime(t).Load(ctx, []byte(statefulPolicy))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	rng := rand.New(rand.NewPCG(41, 5))
	var seeds [][]byte
	for _, f := range failures(3, 40) {
		seeds = append(seeds, failureValue(t, f))
	}
	for _, c := range inputsFile(t).Cases {
		if enc, _, _, ok := caseValue(t, c); ok && len(enc) < 1<<16 {
			seeds = append(seeds, enc)
		}
	}
	for i := range 4000 {
		var b []byte
		switch i % 3 {
		case 0:
			b = make([]byte, rng.IntN(64))
			for j := range b {
				b[j] = byte(rng.IntN(12)) // mostly tags and small lengths
			}
		case 1:
			s := seeds[rng.IntN(len(seeds))]
			b = append([]byte{}, s[:rng.IntN(len(s)+1)]...)
		default:
			b = append([]byte{}, seeds[rng.IntN(len(seeds))]...)
			for range 1 + rng.IntN(3) {
				b[rng.IntN(len(b))] = byte(rng.Uint32())
			}
		}
		w, msg, err := host.CallValue(ctx, p, -1, b, int32(len(b)), 0, 0)
		if err != nil || (w < 0 && w != abi.ErrInput) || (w == abi.ErrInput && !strings.HasPrefix(msg, "invalid failure: ")) {
			t.Fatalf("decide_value(%x) = %d %q, %v", b, w, msg, err)
		}
		w, msg, err = host.CallValue(ctx, p, int32(i%4), b, int32(len(b)), int64(i%3), 2)
		if err != nil || (w < 0 && w != abi.ErrInput) || (w < 0 && !strings.HasPrefix(msg, "invalid ")) {
			t.Fatalf("outcome_value(%d, %x) = %d %q, %v", i%4, b, w, msg, err)
		}
	}
}

// The value comes before the handle, as the hosts checked a failure before
// they called the module: with handle 0 a host checks a lone value (-3 and
// the field's message, or -1 when it is valid); outcome_value checks the
// encoding, then the event, then the failure, then the handle.
func TestValueBeforeHandle(t *testing.T) {
	ctx := context.Background()
	rt := runtime(t)
	bad, _ := failvalue.Append(nil, map[string]any{"now_ms": "soon"})
	good, _ := failvalue.Append(nil, map[string]any{"now_ms": 5})
	unknown, _ := failvalue.Append(nil, map[string]any{"bogus": 1})
	failure := int32(policy.EventFailure)
	for _, c := range []struct {
		event int32
		value []byte
		want  int64
		msg   string
	}{
		{-1, bad, abi.ErrInput, "invalid failure: now_ms: must be an integer (got a string)"},
		{-1, unknown, abi.ErrInput, "invalid failure: bogus: unknown field"},
		{-1, []byte{99}, abi.ErrInput, "invalid failure: value: unknown tag 99 at byte 0"},
		{-1, good, abi.ErrHandle, "unknown or freed policy handle 0"},
		{failure, []byte{99}, abi.ErrInput, "invalid failure: value: unknown tag 99 at byte 0"},
		{9, bad, abi.ErrInput, "invalid event: event: must be 0 (before) to 3 (delivered) (got 9)"},
		{failure, unknown, abi.PackOutcome(policy.Outcome{Action: policy.OutcomeDeadLetter, Reason: policy.Malformed,
			Count: policy.CountDeadLetter, Invalid: true}), "invalid failure: bogus: unknown field"},
		{int32(policy.EventBefore), bad, abi.ErrInput, "invalid failure: now_ms: must be an integer (got a string)"},
		{int32(policy.EventBefore), good, abi.ErrHandle, "unknown or freed policy handle 0"},
		{failure, good, abi.ErrHandle, "unknown or freed policy handle 0"},
	} {
		w, msg, err := host.CallValueHandle(ctx, rt, 0, c.event, c.value)
		if err != nil || w != c.want || msg != c.msg {
			t.Errorf("event %d, %x: %#x %q (%v), want %#x %q", c.event, c.value, w, msg, err, c.want, c.msg)
		}
	}
}
