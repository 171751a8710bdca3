// Package abi is the one Go home of backstop.wasm's ABI (wasm/ABI.md): its
// version, error codes, limits, flags, the decide_batch record and the
// packed decision. The module (wasm/) and the Go host (host/) both use it,
// so they cannot drift apart; the Node.js and Python hosts follow ABI.md.
package abi

import (
	"encoding/binary"
	"math"
	"unsafe"

	"github.com/backstop-dev/backstop/policy"
)

// Version is the ABI version the module exports as abi_version and the
// hosts accept.
const Version = 1

// Error codes (ABI.md, "Error codes"): negative results of the exports.
const (
	ErrHandle   = -1 // unknown or freed policy handle
	ErrPolicy   = -2 // invalid policy bytes or preset name
	ErrInput    = -3 // an invalid input field or batch record
	ErrMemory   = -4 // a buffer too large or the handle table full
	ErrInternal = -6 // a bug: a recovered panic
)

// Limits (ABI.md, "Memory").
const (
	MinBuffer  = 4 << 10  // the smallest buffer the module allocates
	MaxBuffer  = 64 << 20 // the largest buffer a host may ask for
	MaxHandles = 1 << 16  // live policies per instance
	MaxStrLen  = math.MaxUint16
)

// Flags of decide and of a batch record; other bits must be 0.
const (
	FlagIdempotencyKey = 1 << 0 // the request carries an idempotency key
	FlagPushback       = 1 << 1 // the hint is grpc-retry-pushback-ms, not Retry-After
	FlagRetriedDown    = 1 << 2 // a layer below already retried and gave up
	FlagServerDeclined = 1 << 3 // the server asked not to be retried
	Flags              = FlagIdempotencyKey | FlagPushback | FlagRetriedDown | FlagServerDeclined
)

// RecordSize and ResultSize are the sizes of a decide_batch input record
// and result word.
const (
	RecordSize = 64
	ResultSize = 8
)

// Record is one decide_batch input record as laid out in ABI.md: 64 bytes,
// little-endian, every field at its natural alignment. wasm is
// little-endian, so the module reads an 8-aligned record in place.
type Record struct {
	Attempt, ElapsedMs, NowMs int64
	Random                    float64
	PrevDelayMs               int64
	HTTPStatus, GRPCCode      int32
	Flags, StrOff             uint32
	MethodLen, KindLen        uint16
	HintLen, Reserved         uint16
}

// The Record type must be exactly the ABI's 64 bytes.
var (
	_ [RecordSize - unsafe.Sizeof(Record{})]byte
	_ [unsafe.Sizeof(Record{}) - RecordSize]byte
)

// Put writes r into b[:RecordSize] in the ABI's byte order, whatever the
// host's.
func (r *Record) Put(b []byte) {
	le := binary.LittleEndian
	_ = b[RecordSize-1] // one bounds check
	le.PutUint64(b[0:], uint64(r.Attempt))
	le.PutUint64(b[8:], uint64(r.ElapsedMs))
	le.PutUint64(b[16:], uint64(r.NowMs))
	le.PutUint64(b[24:], math.Float64bits(r.Random))
	le.PutUint64(b[32:], uint64(r.PrevDelayMs))
	le.PutUint32(b[40:], uint32(r.HTTPStatus))
	le.PutUint32(b[44:], uint32(r.GRPCCode))
	le.PutUint32(b[48:], r.Flags)
	le.PutUint32(b[52:], r.StrOff)
	le.PutUint16(b[56:], r.MethodLen)
	le.PutUint16(b[58:], r.KindLen)
	le.PutUint16(b[60:], r.HintLen)
	le.PutUint16(b[62:], r.Reserved)
}

// The packed decision (ABI.md, "The packed decision"): bits 0-47
// delay_ms, 48-51 reason, 52-53 class, 54 action, the rest 0, so a
// decision is never negative and negative words are error codes.
const delayMask = 1<<48 - 1

// MaxDelayMs is the largest delay a packed decision carries (about 8,900
// years; a policy's durations stop at about 292, and its hints at one).
const MaxDelayMs = delayMask

// Pack encodes d in one result word.
func Pack(d policy.Decision) int64 {
	return d.DelayMs&delayMask | int64(d.Reason)<<48 | int64(d.Class)<<52 | int64(d.Action)<<54
}

// Unpack decodes a word made by Pack.
func Unpack(w int64) policy.Decision {
	return policy.Decision{
		DelayMs: w & delayMask,
		Reason:  policy.Reason(w >> 48 & 0xf),
		Class:   policy.Class(w >> 52 & 0x3),
		Action:  policy.Action(w >> 54 & 0x1),
	}
}

// The packed permit of acquire (ABI.md, "acquire"): bits 0-47
// retry_in_ms, 48-49 the breaker's state, 50 allowed, the rest 0, so a
// permit is never negative and negative words are error codes.
const permitAllowed = 1 << 50

// PackPermit encodes p in one result word. A wait past MaxDelayMs (a
// clock that jumped about) is clamped to it rather than wrapped.
func PackPermit(p policy.Permit) int64 {
	w := min(max(p.RetryInMs, 0), MaxDelayMs) | int64(p.State)<<48
	if p.Allowed {
		w |= permitAllowed
	}
	return w
}

// UnpackPermit decodes a word made by PackPermit.
func UnpackPermit(w int64) policy.Permit {
	return policy.Permit{
		Allowed:   w&permitAllowed != 0,
		RetryInMs: w & delayMask,
		State:     policy.CircuitState(w >> 48 & 0x3),
	}
}

// The packed answer of budget_tokens (ABI.md, "budget_tokens"): bits 0-47
// the budget's milli-tokens (Policy.BudgetTokens), 48 set when the policy
// has a budget, the rest 0, so an answer is never negative.
const budgetPresent = 1 << 48

// PackBudget encodes BudgetTokens' answer in one result word, clamping the
// amount to 0..MaxDelayMs.
func PackBudget(milli int64, ok bool) int64 {
	if !ok {
		return 0
	}
	return min(max(milli, 0), delayMask) | budgetPresent
}

// UnpackBudget decodes a word made by PackBudget.
func UnpackBudget(w int64) (milli int64, ok bool) {
	return w & delayMask, w&budgetPresent != 0
}

// The results of policy_on_open, in policy.OnOpen's terms.
const (
	OnOpenDefer      = 0 // policy.OnOpenDefer
	OnOpenDeadLetter = 1 // policy.OnOpenDeadLetter
)
