package abi_test

import (
	"encoding/binary"
	"math"
	"testing"
	"unsafe"

	"github.com/backstop-dev/backstop/internal/abi"
	"github.com/backstop-dev/backstop/policy"
)

// Put writes every field at its ABI.md offset, and the module's in-place
// read of those bytes (a *Record over them) gives back the same record.
func TestRecordPut(t *testing.T) {
	r := abi.Record{
		Attempt: 1 << 40, ElapsedMs: 2, NowMs: -3, Random: 0.25, PrevDelayMs: 5,
		HTTPStatus: 503, GRPCCode: -14, Flags: abi.Flags, StrOff: 1 << 31,
		MethodLen: 7, KindLen: 8, HintLen: math.MaxUint16, Reserved: 9,
	}
	b := make([]byte, abi.RecordSize+8) // room to align
	off := (8 - int(uintptr(unsafe.Pointer(&b[0]))%8)) % 8
	rec := b[off : off+abi.RecordSize]
	r.Put(rec)
	le := binary.LittleEndian
	for _, f := range []struct {
		name      string
		at, width int
		want      uint64
	}{
		{"attempt", 0, 8, 1 << 40}, {"elapsed_ms", 8, 8, 2}, {"now_ms", 16, 8, uint64(1<<64 - 3)},
		{"random", 24, 8, math.Float64bits(0.25)}, {"prev_delay_ms", 32, 8, 5},
		{"http_status", 40, 4, 503}, {"grpc_code", 44, 4, uint64(uint32(1<<32 - 14))},
		{"flags", 48, 4, abi.Flags}, {"str_off", 52, 4, 1 << 31},
		{"method_len", 56, 2, 7}, {"kind_len", 58, 2, 8}, {"hint_len", 60, 2, math.MaxUint16}, {"reserved", 62, 2, 9},
	} {
		var got uint64
		switch f.width {
		case 8:
			got = le.Uint64(rec[f.at:])
		case 4:
			got = uint64(le.Uint32(rec[f.at:]))
		case 2:
			got = uint64(le.Uint16(rec[f.at:]))
		}
		if got != f.want {
			t.Errorf("%s at offset %d: got %#x, want %#x", f.name, f.at, got, f.want)
		}
	}
	if little := binary.NativeEndian.Uint16([]byte{1, 0}) == 1; little {
		if got := *(*abi.Record)(unsafe.Pointer(&rec[0])); got != r {
			t.Errorf("read in place: %+v, want %+v", got, r)
		}
	}
}

// Pack and Unpack round-trip every action, reason and class with the
// largest delay, and a decision is never negative.
func TestPack(t *testing.T) {
	for a := range 2 {
		for r := range len(policy.Reasons()) {
			for c := range 3 {
				d := policy.Decision{Action: policy.Action(a), Reason: policy.Reason(r), Class: policy.Class(c), DelayMs: abi.MaxDelayMs}
				w := abi.PackDecision(d)
				if w < 0 || abi.UnpackDecision(w) != d {
					t.Fatalf("%+v -> %d -> %+v", d, w, abi.UnpackDecision(w))
				}
			}
		}
	}
	// ABI.md's example bits: 54 action, 52-53 class, 48-51 reason.
	d := policy.Decision{Action: policy.DeadLetter, Reason: policy.Reason(3), Class: policy.Class(1), DelayMs: 0}
	if w, want := abi.PackDecision(d), int64(1<<54|1<<52|3<<48); w != want {
		t.Errorf("Pack(%+v) = %#x, want %#x", d, w, want)
	}
}

// PackBudget's bits are ABI.md's: the amount clamped to 0..MaxDelayMs, bit
// 48 for "has a budget", never negative.
func TestPackBudget(t *testing.T) {
	for _, c := range []struct {
		milli int64
		ok    bool
		w     int64
	}{
		{0, false, 0}, {123, false, 0}, {0, true, 1 << 48}, {9500, true, 1<<48 | 9500},
		{math.MaxInt64, true, 1<<48 | abi.MaxDelayMs}, {-5, true, 1 << 48},
	} {
		w := abi.PackBudget(c.milli, c.ok)
		if w != c.w {
			t.Errorf("PackBudget(%d, %v) = %#x, want %#x", c.milli, c.ok, w, c.w)
		}
		if m, ok := abi.UnpackBudget(w); ok != c.ok || m != w&abi.MaxDelayMs {
			t.Errorf("UnpackBudget(%#x) = %d, %v", w, m, ok)
		}
	}
}

// PackPermit and UnpackPermit round-trip every state with the largest wait,
// a permit is never negative, and the bits are ABI.md's.
func TestPackPermit(t *testing.T) {
	for _, allowed := range []bool{false, true} {
		for s := range 3 {
			p := policy.Permit{Allowed: allowed, State: policy.CircuitState(s), RetryInMs: abi.MaxDelayMs}
			w := abi.PackPermit(p)
			if w < 0 || abi.UnpackPermit(w) != p {
				t.Fatalf("%+v -> %d -> %+v", p, w, abi.UnpackPermit(w))
			}
		}
	}
	p := policy.Permit{Allowed: true, State: policy.BreakerHalfOpen}
	if w, want := abi.PackPermit(p), int64(1<<50|2<<48); w != want {
		t.Errorf("PackPermit(%+v) = %#x, want %#x", p, w, want)
	}
	if got := abi.UnpackPermit(abi.PackPermit(policy.Permit{RetryInMs: math.MaxInt64, State: policy.BreakerOpen})); got.RetryInMs != abi.MaxDelayMs || got.State != policy.BreakerOpen {
		t.Errorf("a wait past MaxDelayMs: %+v, want it clamped", got)
	}
}

// PackOutcome and UnpackOutcome round-trip every action, reason and count
// (with every class) with the largest delay and both bits, an outcome is never negative, and
// the bits are ABI.md's.
func TestPackOutcome(t *testing.T) {
	for a := range 5 {
		for r := range 19 {
			for c := range 5 {
				for bits := range 4 {
					o := policy.Outcome{Action: policy.OutcomeAction(a), Reason: policy.Reason(r), Class: policy.Class((r + c) % 3), Count: policy.Count(c),
						DelayMs: abi.MaxDelayMs, Pause: bits&1 != 0, Invalid: bits&2 != 0}
					w := abi.PackOutcome(o)
					if w < 0 || abi.UnpackOutcome(w) != o {
						t.Fatalf("%+v -> %#x -> %+v", o, w, abi.UnpackOutcome(w))
					}
				}
			}
		}
	}
	o := policy.Outcome{Action: policy.OutcomeDeadLetter, Reason: policy.Malformed, Class: policy.Uncertain, Count: policy.CountDeadLetter, Invalid: true, Pause: true, DelayMs: 7}
	if w, want := abi.PackOutcome(o), int64(1<<62|3<<59|1<<58|4<<55|2<<53|17<<48|7); w != want {
		t.Errorf("PackOutcome(%+v) = %#x, want %#x", o, w, want)
	}
	if w := abi.PackOutcome(policy.Outcome{DelayMs: -5}); w != 0 {
		t.Errorf("a negative delay packs as %#x, want 0", w)
	}
}
