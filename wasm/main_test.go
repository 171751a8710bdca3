package main

import (
	"encoding/binary"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/backstop-dev/backstop/internal/abi"
	"github.com/backstop-dev/backstop/policy"
)

// These tests call the exports as plain Go functions (natively), where
// allocations can be counted. Addresses are not checked here: they are
// wasm32 addresses only in the real module (see host/ for those tests).

func load(t testing.TB, text string) int32 {
	t.Helper()
	buffer(int32(len(text)))
	copy(buf, text)
	h := policy_load(int32(len(text)))
	if h <= 0 {
		t.Fatalf("policy_load = %d: %s", h, lastMsg)
	}
	return h
}

func TestDecideMatchesNative(t *testing.T) {
	h := load(t, "default")
	native, _ := policy.Preset("default")
	buffer(64)
	n := copy(buf, "POST")
	n += copy(buf[n:], "timeout")
	copy(buf[n:], "5")
	got := decide(h, 2, 0, 0, 100, 1000, 0.5, 0, flagIdempotencyKey, 4, 7, 1)
	want, err := native.Decide(policy.Failure{Attempt: 2, ElapsedMs: 100, NowMs: 1000, Random: 0.5,
		Method: "POST", ErrorKind: "timeout", RetryAfter: "5", IdempotencyKey: "k"})
	if err != nil || got != abi.PackDecision(want) {
		t.Fatalf("decide = %v, native = %v (%v)", abi.UnpackDecision(got), want, err)
	}
	// Same strings, pushback flag: the hint is read as milliseconds.
	got = decide(h, 2, 0, 0, 100, 1000, 0.5, 0, flagIdempotencyKey|flagPushback, 4, 7, 1)
	want, _ = native.Decide(policy.Failure{Attempt: 2, ElapsedMs: 100, NowMs: 1000, Random: 0.5,
		Method: "POST", ErrorKind: "timeout", RetryPushback: "5", IdempotencyKey: "k"})
	if got != abi.PackDecision(want) {
		t.Fatalf("pushback: decide = %v, native = %v", abi.UnpackDecision(got), want)
	}
}

func TestDecideDoesNotAllocate(t *testing.T) {
	h := load(t, "batch")
	buffer(64)
	copy(buf, "GETtimeout")
	allocs := testing.AllocsPerRun(1000, func() {
		if r := decide(h, 3, 503, 0, 10, 1000, 0.25, 0, 0, 3, 7, 0); r < 0 {
			t.Fatal(lastMsg)
		}
	})
	if allocs != 0 {
		t.Errorf("decide allocates %v times per call", allocs)
	}
}

func TestDecideErrors(t *testing.T) {
	h := load(t, "default")
	buffer(minBuffer)
	for _, tc := range []struct {
		name string
		call func() int64
		code int64
		msg  string
	}{
		{"bad handle", func() int64 { return decide(9999, 1, 503, 0, 0, 0, 0, 0, 0, 0, 0, 0) }, errHandle, "handle 9999"},
		{"attempt 0", func() int64 { return decide(h, 0, 503, 0, 0, 0, 0, 0, 0, 0, 0, 0) }, errInput, "invalid failure: attempt: must be >= 1"},
		{"grpc 99", func() int64 { return decide(h, 1, 0, 99, 0, 0, 0, 0, 0, 0, 0, 0) }, errInput, "invalid failure: grpc_code"},
		{"elapsed", func() int64 { return decide(h, 1, 503, 0, -1, 0, 0, 0, 0, 0, 0, 0) }, errInput, "invalid failure: elapsed_ms"},
		{"flags", func() int64 { return decide(h, 1, 503, 0, 0, 0, 0, 0, unknownFlag, 0, 0, 0) }, errInput, "flags: " + abi.FlagsError},
		{"negative length", func() int64 { return decide(h, 1, 503, 0, 0, 0, 0, 0, 0, -1, 0, 0) }, errInput, "lengths"},
		{"past buffer", func() int64 { return decide(h, 1, 503, 0, 0, 0, 0, 0, 0, minBuffer, 1, 0) }, errInput, "outside the buffer"},
		{"wrapping lengths", func() int64 {
			return decide(h, 1, 503, 0, 0, 0, 0, 0, 0, math.MaxInt32, math.MaxInt32, math.MaxInt32)
		}, errInput, "outside the buffer"},
	} {
		if got := tc.call(); got != tc.code || !strings.Contains(lastMsg, tc.msg) {
			t.Errorf("%s: got %d (%q), want %d naming %q", tc.name, got, lastMsg, tc.code, tc.msg)
		}
	}
}

func TestErrorMessagesNameTheField(t *testing.T) {
	text := `{"backoff": {"base": "1s", "cap": "100ms"}}`
	buffer(int32(len(text)))
	copy(buf, text)
	if r := policy_load(int32(len(text))); r != errPolicy || !strings.Contains(lastMsg, "backoff.cap") {
		t.Errorf("policy_load = %d %q, want -2 naming backoff.cap", r, lastMsg)
	}
	copy(buf, "nope")
	if r := policy_preset(4); r != errPolicy || !strings.Contains(lastMsg, `unknown preset "nope"`) {
		t.Errorf("policy_preset = %d %q", r, lastMsg)
	}
}

func TestHandles(t *testing.T) {
	a := load(t, "default")
	b := load(t, "critical")
	if a == b || a < 1 || b < 1 {
		t.Fatalf("handles %d %d", a, b)
	}
	if policy_free(a) != 0 || policy_free(a) != errHandle || policy_stateful(a) != errHandle {
		t.Fatal("freeing twice or using a freed handle must give -1")
	}
	if c := load(t, "batch"); c != a {
		t.Errorf("freed slot %d not reused (got %d)", a, c)
	}
	for _, h := range []int32{0, -1, math.MaxInt32} {
		if policy_stateful(h) != errHandle || record_success(h, 0) != errHandle ||
			circuit_state(h, 0) != errHandle || decide_batch(h, 0, 0, 0) != errHandle {
			t.Errorf("handle %d accepted", h)
		}
	}
	s := load(t, `{"circuit_breaker": {"failure_threshold": 1}}`)
	if policy_stateful(s) != 1 || policy_stateful(b) != 0 {
		t.Error("policy_stateful")
	}
	decide(s, 1, 503, 0, 0, 1000, 0, 0, 0, 0, 0, 0)
	if circuit_state(s, 1000) != int32(policy.BreakerOpen) {
		t.Error("breaker did not open")
	}
}

func TestBuffer(t *testing.T) {
	if buffer(-1) != errMemory || buffer(maxBuffer+1) != errMemory {
		t.Error("bad sizes accepted")
	}
	buffer(0)
	if len(buf) < minBuffer {
		t.Errorf("buffer(0) gave %d bytes, want >= %d", len(buf), minBuffer)
	}
	buf[0] = 42
	buffer(int32(len(buf)) + 1)
	if buf[0] != 42 {
		t.Error("growing lost the contents")
	}
}

func TestGuardRecoversPanics(t *testing.T) {
	r := func() (r int32) {
		defer guard32("test", &r)
		var p *policy.Policy
		p.Stateful() // nil dereference
		return 0
	}()
	if r != errInternal || !strings.Contains(lastMsg, "internal error in test") {
		t.Errorf("got %d %q", r, lastMsg)
	}
}

// putRecord writes one decide_batch record at off with its strings at strOff.
func putRecord(off, strOff int, f policy.Failure) {
	le := binary.LittleEndian
	rec := buf[off : off+recordSize]
	le.PutUint64(rec[0:], uint64(f.Attempt))
	le.PutUint64(rec[8:], uint64(f.ElapsedMs))
	le.PutUint64(rec[16:], uint64(f.NowMs))
	le.PutUint64(rec[24:], math.Float64bits(f.Random))
	le.PutUint64(rec[32:], uint64(f.PrevDelayMs))
	le.PutUint32(rec[40:], uint32(int32(f.HTTPStatus)))
	le.PutUint32(rec[44:], uint32(int32(f.GRPCCode)))
	var flags uint32
	hint := f.RetryAfter
	if hint == "" && f.RetryPushback != "" {
		hint, flags = f.RetryPushback, flagPushback
	}
	if f.IdempotencyKey != "" {
		flags |= flagIdempotencyKey
	}
	if f.RetriedDownstream {
		flags |= abi.FlagRetriedDownstream
	}
	if f.ServerDeclined {
		flags |= abi.FlagServerDeclined
	}
	le.PutUint32(rec[48:], flags)
	le.PutUint32(rec[52:], uint32(strOff))
	le.PutUint16(rec[56:], uint16(len(f.Method)))
	le.PutUint16(rec[58:], uint16(len(f.ErrorKind)))
	le.PutUint16(rec[60:], uint16(len(hint)))
	le.PutUint16(rec[62:], 0)
	n := copy(buf[strOff:], f.Method)
	n += copy(buf[strOff+n:], f.ErrorKind)
	copy(buf[strOff+n:], hint)
}

func TestBatch(t *testing.T) {
	text := `{"max_attempts": 4, "circuit_breaker": {"failure_threshold": 3, "open_for": "1s"}}`
	h := load(t, text)
	native, _ := policy.Parse([]byte(text))
	failures := []policy.Failure{
		{Attempt: 1, HTTPStatus: 503, NowMs: 1000, Random: 0.1},
		{Attempt: 0, HTTPStatus: 503}, // invalid: -3, the batch goes on
		{Attempt: 2, ErrorKind: "timeout", Method: "POST", IdempotencyKey: "k", NowMs: 1001, Random: 0.9},
		{Attempt: 3, HTTPStatus: 429, RetryAfter: "2", NowMs: 1002},
		{Attempt: 1, GRPCCode: 14, RetryPushback: "250", NowMs: 1003},
		{Attempt: 1, HTTPStatus: 503, NowMs: 5000},
	}
	buffer(minBuffer)
	const in, strs, out = 0, 1024, 2048
	for i, f := range failures {
		putRecord(in+i*recordSize, strs+i*32, f)
	}
	if r := decide_batch(h, in, int32(len(failures)), out); r != int32(len(failures)) {
		t.Fatalf("decide_batch = %d: %s", r, lastMsg)
	}
	if !strings.HasPrefix(lastMsg, "record 1: invalid failure: attempt") {
		t.Errorf("message %q does not name record 1", lastMsg)
	}
	for i, f := range failures {
		got := int64(binary.LittleEndian.Uint64(buf[out+i*resultSize:]))
		want, err := native.Decide(f)
		if err != nil {
			if got != errInput {
				t.Errorf("record %d: got %d, want -3", i, got)
			}
			continue
		}
		if got != abi.PackDecision(want) {
			t.Errorf("record %d: got %v, want %v", i, abi.UnpackDecision(got), want)
		}
	}
}

func TestBatchBounds(t *testing.T) {
	h := load(t, "default")
	buffer(minBuffer)
	size := int32(len(buf))
	for _, tc := range []struct{ in, n, out int32 }{
		{0, -1, 0},
		{4, 1, 512},                        // misaligned
		{0, size/recordSize + 1, 0},        // records past the end
		{0, 1, size},                       // results past the end
		{size - 8, math.MaxInt32, 0},       // overflowing n
		{-8, 1, 64},                        // negative offset
		{math.MaxInt32 - 7, 1, 0},          // offset past the end
		{0, 1, math.MaxInt32 &^ 7},         // out offset past the end
		{0, math.MaxInt32 / recordSize, 0}, // n×64 still fits int32, not the buffer
	} {
		if r := decide_batch(h, tc.in, tc.n, tc.out); r != errInput {
			t.Errorf("decide_batch(%d, %d, %d) = %d, want -3", tc.in, tc.n, tc.out, r)
		}
	}
	// A record whose strings fall outside the buffer fails alone.
	putRecord(0, 0, policy.Failure{Attempt: 1, HTTPStatus: 503})
	putRecord(64, 0, policy.Failure{Attempt: 1, HTTPStatus: 503})
	binary.LittleEndian.PutUint32(buf[52:], uint32(size-2))
	binary.LittleEndian.PutUint16(buf[56:], 3)
	if r := decide_batch(h, 0, 2, 256); r != 2 {
		t.Fatalf("decide_batch = %d", r)
	}
	if got := int64(binary.LittleEndian.Uint64(buf[256:])); got != errInput {
		t.Errorf("out-of-bounds strings: got %d", got)
	}
	if got := int64(binary.LittleEndian.Uint64(buf[264:])); got < 0 {
		t.Errorf("the next record failed too: %d", got)
	}
	// Reserved bits.
	putRecord(0, 0, policy.Failure{Attempt: 1, HTTPStatus: 503})
	buf[62] = 1
	decide_batch(h, 0, 1, 256)
	if got := int64(binary.LittleEndian.Uint64(buf[256:])); got != errInput {
		t.Errorf("reserved bits: got %d", got)
	}
}

func TestBatchDoesNotAllocate(t *testing.T) {
	h := load(t, "default")
	buffer(minBuffer)
	for i := 0; i < 16; i++ {
		putRecord(i*recordSize, 2048, policy.Failure{Attempt: int64(i%5 + 1), HTTPStatus: 503, Method: "GET", Random: 0.5})
	}
	allocs := testing.AllocsPerRun(100, func() { decide_batch(h, 0, 16, 1024) })
	if allocs != 0 {
		t.Errorf("decide_batch allocates %v times per call", allocs)
	}
}

// The handle table fills at maxHandles (then -4, ERR_MEMORY, naming the
// limit), and freeing every handle makes each reusable, round after round,
// without the table or its free list growing. (In the real module, filling
// and freeing it three times used to trap: not this logic, but a GC that
// had stopped; host/ tests the module's memory.)
func TestHandleTableRefills(t *testing.T) {
	p, err := policy.Preset("default")
	if err != nil {
		t.Fatal(err)
	}
	savedPolicies, savedFree := policies, freeSlots
	policies, freeSlots = nil, nil
	t.Cleanup(func() { policies, freeSlots = savedPolicies, savedFree })
	for round := range 3 {
		seen := make([]bool, maxHandles+1)
		for range maxHandles {
			h := addPolicy(p)
			if h < 1 || h > maxHandles || seen[h] {
				t.Fatalf("round %d: handle %d is out of range or taken", round, h)
			}
			seen[h] = true
		}
		if h := addPolicy(p); h != errMemory || !strings.Contains(lastMsg, "handle table is full (65536 policies)") {
			t.Fatalf("round %d: a full table gave %d %q, want -4", round, h, lastMsg)
		}
		for h := int32(1); h <= maxHandles; h++ {
			if r := policy_free(h); r != 0 {
				t.Fatalf("round %d: policy_free(%d) = %d", round, h, r)
			}
		}
		if len(policies) != maxHandles || len(freeSlots) != maxHandles {
			t.Fatalf("round %d: table %d, free list %d", round, len(policies), len(freeSlots))
		}
	}
}

// A host that grows the buffer a little at a time (64 KiB steps to the
// maximum) causes a dozen reallocations, not a thousand, and the buffer
// never exceeds maxBuffer.
func TestBufferGrowsGeometrically(t *testing.T) {
	saved := buf
	buf = nil
	t.Cleanup(func() { buf = saved })
	moves, last := 0, -1
	for n := 64 << 10; n <= maxBuffer; n += 64 << 10 {
		if r := buffer(int32(n)); r == errMemory || len(buf) < n || len(buf) > maxBuffer {
			t.Fatalf("buffer(%d) = %d, %d bytes: %s", n, r, len(buf), lastMsg)
		}
		if a := int(uintptr(unsafe.Pointer(&buf[0]))); a != last {
			moves, last = moves+1, a
		}
	}
	if moves > 12 {
		t.Errorf("the buffer moved %d times on its way to %d MiB", moves, maxBuffer>>20)
	}
}

// acquire answers in the packed permit, and refuses what decide refuses:
// a bad handle, a negative now_ms, and now_ms 0 on a stateful policy.
func TestAcquire(t *testing.T) {
	s := load(t, `{"circuit_breaker": {"failure_threshold": 1, "open_for": "1s"}, "on_open": "dead_letter"}`)
	d := load(t, "default")
	if w := acquire(d, 0); w < 0 || !abi.UnpackPermit(w).Allowed {
		t.Errorf("stateless acquire(0) = %d %q, want allowed", w, lastMsg)
	}
	for _, c := range []struct {
		h    int32
		now  int64
		code int64
		msg  string
	}{
		{0, 1000, errHandle, "handle"},
		{s, 0, errInput, "now_ms: must be set"},
		{d, -1, errInput, "now_ms: must be >= 0"},
	} {
		if w := acquire(c.h, c.now); w != c.code || !strings.Contains(lastMsg, c.msg) {
			t.Errorf("acquire(%d, %d) = %d %q, want %d naming %q", c.h, c.now, w, lastMsg, c.code, c.msg)
		}
	}
	decide(s, 1, 503, 0, 0, 1000, 0, 0, 0, 0, 0, 0)
	if p := abi.UnpackPermit(acquire(s, 1200)); p != (policy.Permit{RetryInMs: 800, State: policy.BreakerOpen}) {
		t.Errorf("open: %+v", p)
	}
	if p := abi.UnpackPermit(acquire(s, 2000)); p != (policy.Permit{Allowed: true, State: policy.BreakerHalfOpen}) {
		t.Errorf("half-open: %+v", p)
	}
	if policy_on_open(s) != abi.OnOpenDeadLetter || policy_on_open(d) != abi.OnOpenDefer || policy_on_open(0) != errHandle {
		t.Error("policy_on_open")
	}
}

// budget_tokens packs the budget left and whether there is one, reads it
// without changing it, and refuses a bad handle or a negative now_ms.
func TestBudgetTokens(t *testing.T) {
	s := load(t, `{"retry_budget": {"max_tokens": 10, "token_ratio": 0.5}}`)
	d := load(t, "default")
	if m, ok := abi.UnpackBudget(budget_tokens(d, 1000)); ok || m != 0 {
		t.Errorf("no budget: %d, %v", m, ok)
	}
	if w := budget_tokens(0, 1000); w != errHandle {
		t.Errorf("handle 0: %d", w)
	}
	if w := budget_tokens(s, -1); w != errInput || !strings.Contains(lastMsg, "now_ms: must be >= 0") {
		t.Errorf("now_ms -1: %d %q", w, lastMsg)
	}
	decide(s, 1, 503, 0, 0, 1000, 0, 0, 0, 0, 0, 0)
	for range 2 {
		if m, ok := abi.UnpackBudget(budget_tokens(s, 1000)); !ok || m != 9000 {
			t.Errorf("after a failure: %d, %v; want 9000", m, ok)
		}
	}
}

// attempt_timeout answers in ms, reads no state, and refuses a bad handle
// or a negative elapsed_ms.
func TestAttemptTimeout(t *testing.T) {
	p := load(t, `{"attempt_timeout": "2s", "max_elapsed": "5s"}`)
	if w := attempt_timeout(p, 4000); w != 1000 {
		t.Errorf("at 4s: %d, want 1000", w)
	}
	if w := attempt_timeout(load(t, "default"), 0); w < 0 {
		t.Errorf("default: %d", w)
	}
	if w := attempt_timeout(0, 0); w != errHandle {
		t.Errorf("handle 0: %d", w)
	}
	if w := attempt_timeout(p, -1); w != errInput || !strings.Contains(lastMsg, "elapsed_ms: must be >= 0") {
		t.Errorf("elapsed_ms -1: %d %q", w, lastMsg)
	}
}

// connect_timeout answers the policy's field in ms, 0 without one, and
// refuses a bad handle.
func TestConnectTimeout(t *testing.T) {
	if w := connect_timeout(load(t, `{"attempt_timeout": "2s", "connect_timeout": "300ms"}`)); w != 300 {
		t.Errorf("connect_timeout: %d, want 300", w)
	}
	if w := connect_timeout(load(t, "default")); w != 0 {
		t.Errorf("default: %d, want 0", w)
	}
	if w := connect_timeout(0); w != errHandle {
		t.Errorf("handle 0: %d", w)
	}
}

// out calls the outcome export with a failure of status 503 (strings from
// the buffer: ml, kl, hl) at now.
func out(h, event int32, attempt, now int64, flags, ml, kl, hl int32, deliveries, maxDeliveries int64) int64 {
	return outcome(h, event, attempt, 503, 0, 10, now, 0.5, 0, flags, ml, kl, hl, deliveries, maxDeliveries)
}

// The export answers as policy.Outcome, event by event, on one stateful
// policy (its breaker opens, refuses and half-opens), through the packed
// word.
func TestOutcomeMatchesNative(t *testing.T) {
	const src = `{"backoff": {"strategy": "constant", "base": "100ms"}, "jitter": {"mode": "none"},
		"circuit_breaker": {"failure_threshold": 2, "open_for": "10s"}}`
	h := load(t, src)
	native, err := policy.Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	buffer(64)
	copy(buf, "timeout")
	const t0 = 1_700_000_000_000
	for i, c := range []struct {
		event int32
		now   int64
		kind  bool
	}{
		{int32(policy.EventBefore), t0, false}, {int32(policy.EventFailure), t0, true}, {int32(policy.EventFailure), t0 + 1, false},
		{int32(policy.EventBefore), t0 + 2, false}, {int32(policy.EventBefore), t0 + 10_001, false}, {int32(policy.EventSuccess), t0 + 10_002, false},
		{int32(policy.EventDelivered), 0, false},
	} {
		var kl int32
		f := policy.Failure{Attempt: 1, HTTPStatus: 503, ElapsedMs: 10, NowMs: c.now, Random: 0.5, IdempotencyKey: "k"}
		if c.kind {
			kl, f.ErrorKind = 7, "timeout"
		}
		got := out(h, c.event, 1, c.now, flagIdempotencyKey, 0, kl, 0, 5, 5)
		want, err := native.Outcome(policy.JobEvent{Event: policy.Event(c.event), Failure: f, Deliveries: 5, MaxDeliveries: 5})
		if err != nil || got != abi.PackOutcome(want) {
			t.Fatalf("step %d: outcome = %+v (%d), native = %+v (%v)", i, abi.UnpackOutcome(got), got, want, err)
		}
	}
	if o := abi.UnpackOutcome(out(h, int32(policy.EventBefore), 0, t0+10_003, 0, 0, 0, 0, 0, 0)); o.Action != policy.OutcomeRun {
		t.Errorf("closed again: %+v", o)
	}
}

// An invalid failure is a word (dead_letter malformed, the invalid bit)
// with its message; an invalid event is an error code.
func TestOutcomeErrors(t *testing.T) {
	h := load(t, "default")
	buffer(minBuffer)
	invalid := policy.Outcome{Action: policy.OutcomeDeadLetter, Reason: policy.Malformed, Count: policy.CountDeadLetter, Invalid: true}
	for _, c := range []struct {
		name  string
		call  func() int64
		msg   string
		isErr bool
	}{
		{"attempt 0", func() int64 { return out(h, int32(policy.EventFailure), 0, 1, 0, 0, 0, 0, 0, 0) }, "invalid failure: attempt: must be >= 1 (got 0)", false},
		{"flags", func() int64 { return out(h, int32(policy.EventFailure), 1, 1, unknownFlag, 0, 0, 0, 0, 0) }, "invalid failure: flags: " + abi.FlagsError + " (got " + strconv.Itoa(int(unknownFlag)) + ")", false},
		{"bad handle", func() int64 { return out(9999, int32(policy.EventBefore), 1, 1, 0, 0, 0, 0, 0, 0) }, "unknown or freed policy handle 9999", true},
		{"past buffer", func() int64 { return out(h, int32(policy.EventFailure), 1, 1, 0, int32(len(buf)), 1, 0, 0, 0) }, "outside the buffer", true},
		{"event", func() int64 { return out(h, 4, 1, 1, 0, 0, 0, 0, 0, 0) }, "invalid event: event: must be 0 (before) to 3 (delivered) (got 4)", true},
		{"event -1", func() int64 { return out(h, -1, 1, 1, 0, 0, 0, 0, 0, 0) }, "(got -1)", true},
		{"deliveries", func() int64 { return out(h, int32(policy.EventDelivered), 1, 1, 0, 0, 0, 0, -1, 3) }, "invalid event: deliveries: must be >= 0 (got -1)", true},
		{"now", func() int64 { return out(h, int32(policy.EventBefore), 1, -1, 0, 0, 0, 0, 0, 0) }, "invalid event: now_ms: must be >= 0 (got -1)", true},
	} {
		w := c.call()
		switch {
		case c.isErr && w >= 0, !c.isErr && abi.UnpackOutcome(w) != invalid:
			t.Errorf("%s: %#x (%+v)", c.name, w, abi.UnpackOutcome(w))
		case !strings.Contains(lastMsg, c.msg):
			t.Errorf("%s: message %q, want %q", c.name, lastMsg, c.msg)
		}
		if c.name == "bad handle" && w != errHandle || c.isErr && c.name != "bad handle" && w != errInput {
			t.Errorf("%s: code %d", c.name, w)
		}
	}
}

// outcome_record answers as outcome does for the same failure, event by
// event, on two copies of one stateful policy (so each sees the sequence),
// invalid failures included; a record out of place is an error code.
func TestOutcomeRecord(t *testing.T) {
	const src = `{"max_attempts": 3, "circuit_breaker": {"failure_threshold": 2, "open_for": "10s"}}`
	byArgs, byRecord := load(t, src), load(t, src)
	buffer(minBuffer)
	const rec, t0 = 1024, 1_700_000_000_000
	for i, c := range []struct {
		event int32
		f     policy.Failure
	}{
		{int32(policy.EventBefore), policy.Failure{NowMs: t0}},
		{int32(policy.EventFailure), policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: t0, Random: 0.3, IdempotencyKey: "k", Method: "POST"}},
		{int32(policy.EventFailure), policy.Failure{Attempt: 2, ErrorKind: "timeout", RetryAfter: "7", NowMs: t0 + 1, PrevDelayMs: 40}},
		{int32(policy.EventFailure), policy.Failure{Attempt: 0, HTTPStatus: 503, NowMs: t0 + 2}}, // invalid: malformed
		{int32(policy.EventBefore), policy.Failure{NowMs: t0 + 3}},
		{int32(policy.EventFailure), policy.Failure{Attempt: 1, GRPCCode: 14, RetryPushback: "250", ServerDeclined: true, NowMs: t0 + 4}},
		{int32(policy.EventBefore), policy.Failure{NowMs: t0 + 10_005}},
		{int32(policy.EventSuccess), policy.Failure{NowMs: t0 + 10_006}},
		{int32(policy.EventDelivered), policy.Failure{}},
		{int32(policy.EventBefore), policy.Failure{NowMs: -1}}, // invalid event
	} {
		putRecord(rec+recordSize, 0, c.f) // its strings at 0, where outcome reads them
		putRecord(rec, 2048, c.f)         // and at the record's str_off
		le := binary.LittleEndian
		flags, ml, kl, hl := le.Uint32(buf[rec+48:]), le.Uint16(buf[rec+56:]), le.Uint16(buf[rec+58:]), le.Uint16(buf[rec+60:])
		want := outcome(byArgs, c.event, c.f.Attempt, int32(c.f.HTTPStatus), int32(c.f.GRPCCode), c.f.ElapsedMs, c.f.NowMs,
			c.f.Random, c.f.PrevDelayMs, int32(flags), int32(ml), int32(kl), int32(hl), 4, 4)
		wantMsg := lastMsg
		copy(buf[:64], strings.Repeat("x", 64)) // outcome_record reads str_off, not 0
		if got := outcome_record(byRecord, c.event, rec, 4, 4); got != want || lastMsg != wantMsg {
			t.Fatalf("step %d: outcome_record = %#x %q, outcome = %#x %q", i, got, lastMsg, want, wantMsg)
		}
	}
	putRecord(rec, 0, policy.Failure{Attempt: 1, NowMs: t0})
	buf[rec+62] = 1
	if w := outcome_record(byRecord, int32(policy.EventFailure), rec, 0, 0); w != errInput || !strings.Contains(lastMsg, "reserved bytes") {
		t.Errorf("reserved: %d %q", w, lastMsg)
	}
	for _, off := range []int32{rec + 4, -8, int32(len(buf)) - recordSize + 8} {
		if w := outcome_record(byRecord, int32(policy.EventBefore), off, 0, 0); w != errInput || !strings.Contains(lastMsg, "rec_off must be") {
			t.Errorf("rec_off %d: %d %q", off, w, lastMsg)
		}
	}
	if w := outcome_record(9999, int32(policy.EventBefore), rec, 0, 0); w != errHandle {
		t.Errorf("bad handle: %d", w)
	}
}

func TestOutcomeDoesNotAllocate(t *testing.T) {
	h := load(t, `{"circuit_breaker": {"failure_threshold": 1000000, "open_for": "1s"}, "max_attempts": 1000000}`)
	buffer(64)
	copy(buf, "timeout")
	now := int64(1_700_000_000_000)
	allocs := testing.AllocsPerRun(1000, func() {
		now++
		for _, e := range []int32{int32(policy.EventBefore), int32(policy.EventFailure), int32(policy.EventSuccess), int32(policy.EventDelivered)} {
			if r := out(h, e, 3, now, 0, 0, 7, 0, 1, 5); r < 0 {
				t.Fatal(lastMsg)
			}
		}
	})
	if allocs != 0 {
		t.Errorf("outcome allocates %v times per job", allocs)
	}
}

// unknownFlag is the lowest flag bit the contract does not define.
var unknownFlag = int32(1) << bits.Len32(abi.Flags)
