package main

import (
	"math"
	"testing"

	"github.com/backstop-dev/backstop/internal/abi"
	"github.com/backstop-dev/backstop/internal/failvalue"
	"github.com/backstop-dev/backstop/policy"
)

// The fuzz targets call every export with arbitrary arguments and buffer
// contents. An export may return an error code, never panic: guard turns a
// panic into -6, which these targets treat as a failure.

func noInternal(t *testing.T, name string, r int64) {
	t.Helper()
	if r == errInternal {
		t.Fatalf("%s: internal error: %s", name, lastMsg)
	}
}

func FuzzPolicyLoad(f *testing.F) {
	for _, s := range []string{"default", "batch", `{"max_attempts": 3}`, "max_attempts: x", "", "{", "\x00\xff"} {
		f.Add([]byte(s), int32(len(s)))
	}
	f.Fuzz(func(t *testing.T, data []byte, n int32) {
		buffer(int32(len(data)))
		copy(buf, data)
		h := policy_load(n)
		noInternal(t, "policy_load", int64(h))
		if h > 0 {
			noInternal(t, "policy_stateful", int64(policy_stateful(h)))
			noInternal(t, "policy_free", int64(policy_free(h)))
		} else if lastMsg == "" {
			t.Fatalf("policy_load = %d without a message", h)
		}
		noInternal(t, "policy_preset", int64(policy_preset(n)))
	})
}

func FuzzDecide(f *testing.F) {
	f.Add(int32(1), int64(1), int32(503), int32(0), int64(0), int64(0), 0.5, int64(0), int32(0), int32(0), int32(0), int32(0), "")
	f.Add(int32(1), int64(-1), int32(99), int32(17), int64(-5), int64(-1), math.NaN(), int64(-1), int32(7), int32(-1), int32(3), int32(1<<30), "POSTtimeout12")
	f.Add(int32(2), int64(math.MaxInt64), int32(429), int32(14), int64(1<<62), int64(1767225600000), math.Inf(1), int64(math.MaxInt64), int32(3), int32(4), int32(7), int32(2), "POSTtimeout12")
	f.Add(int32(0), int64(1), int32(0), int32(0), int64(0), int64(0), 0.0, int64(0), int32(0), int32(0), int32(0), int32(0), "")
	f.Fuzz(func(t *testing.T, h int32, attempt int64, status, grpc int32, elapsed, now int64, random float64, prev int64, flags, ml, kl, hl int32, strs string) {
		policies, freeSlots = nil, nil // a fresh handle table for each input
		load(t, `{"retry_budget": {"type": "ratio"}, "circuit_breaker": {}}`)
		load(t, "default")
		buffer(int32(len(strs)))
		copy(buf, strs)
		r := decide(h, attempt, status, grpc, elapsed, now, random, prev, flags, ml, kl, hl)
		noInternal(t, "decide", r)
		if r >= 0 {
			d := abi.UnpackDecision(r)
			if d.DelayMs < 0 || (d.Action == policy.DeadLetter) != (d.Reason > policy.UncertainRetry) {
				t.Fatalf("decide = %+v", d)
			}
		}
		noInternal(t, "record_success", int64(record_success(h, now)))
		noInternal(t, "circuit_state", int64(circuit_state(h, now)))
		for _, at := range []int64{now, elapsed, prev} { // times that may jump about
			if w := acquire(h, at); w >= 0 && w>>51 != 0 {
				t.Fatalf("acquire(%d, %d) = %#x: bits 51-63 set", h, at, w)
			} else {
				noInternal(t, "acquire", w)
			}
		}
		noInternal(t, "policy_on_open", int64(policy_on_open(h)))
		noInternal(t, "error_message", int64(int32(error_message())))
	})
}

func FuzzDecideBatch(f *testing.F) {
	f.Add(make([]byte, 256), int32(1), int32(0), int32(2), int32(128))
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0}, int32(1), int32(8), int32(1), int32(0))
	f.Fuzz(func(t *testing.T, data []byte, h, inOff, n, outOff int32) {
		policies, freeSlots = nil, nil
		load(t, "default")
		buffer(int32(len(data)) + minBuffer)
		copy(buf, data)
		r := decide_batch(h, inOff, n, outOff)
		noInternal(t, "decide_batch", int64(r))
	})
}

func FuzzBuffer(f *testing.F) {
	f.Add(int32(0))
	f.Add(int32(-1))
	f.Add(int32(maxBuffer + 1))
	f.Fuzz(func(t *testing.T, size int32) {
		r := buffer(size)
		noInternal(t, "buffer", int64(r))
		if r >= 0 && len(buf) < int(size) {
			t.Fatalf("buffer(%d) left %d bytes", size, len(buf))
		}
	})
}

func FuzzDecideValue(f *testing.F) {
	for _, v := range []any{
		map[string]any{"attempt": failvalue.Number("2"), "http_status": 503.0, "now_ms": failvalue.Number("1767225600000"), "random": 0.5},
		map[string]any{"attempt": 1.5, "grpc_code": "UNAVAILABLE", "retry_after": []byte("7"), "x": []any{}},
		map[string]any{"attempt": failvalue.Number("1"), "method": failvalue.Other("a timedelta")},
	} {
		b, _ := failvalue.Append(nil, v)
		f.Add(b, int32(len(b)), int32(1), int32(2))
	}
	f.Fuzz(func(t *testing.T, data []byte, n, h, event int32) {
		policies, freeSlots = nil, nil
		load(t, `{"retry_budget": {"type": "ratio"}, "circuit_breaker": {}}`)
		load(t, "default")
		buffer(int32(len(data)))
		copy(buf, data)
		r := decide_value(h, n)
		noInternal(t, "decide_value", r)
		if r < 0 && r != errHandle && r != errInput {
			t.Fatalf("decide_value = %d", r)
		}
		noInternal(t, "outcome_value", outcome_value(h, event, n, 1, 3))
	})
}
