package abi

import "github.com/backstop-dev/backstop/policy"

// The packed outcome of the outcome export (ABI.md, "outcome"): bits 0-47
// delay_ms, 48-53 reason, 54-56 action, 57 pause, 58-60 count, 61
// invalid, 62-63 0, so an outcome is never negative and negative words
// are error codes.
const (
	OutcomeReasonShift = 48
	OutcomeReasonMask  = 0x3f
	OutcomeActionShift = 54
	OutcomeActionMask  = 0x7
	OutcomePause       = 1 << 57
	OutcomeCountShift  = 58
	OutcomeCountMask   = 0x7
	OutcomeInvalid     = 1 << 61
)

// The events of the outcome export, in policy.Event's terms.
const (
	EventBefore    = int32(policy.EventBefore)
	EventSuccess   = int32(policy.EventSuccess)
	EventFailure   = int32(policy.EventFailure)
	EventDelivered = int32(policy.EventDelivered)
)

// PackOutcome encodes o in one result word, its delay clamped to
// 0..MaxDelayMs.
func PackOutcome(o policy.Outcome) int64 {
	w := min(max(o.DelayMs, 0), MaxDelayMs) |
		int64(o.Reason)&OutcomeReasonMask<<OutcomeReasonShift |
		int64(o.Action)&OutcomeActionMask<<OutcomeActionShift |
		int64(o.Count)&OutcomeCountMask<<OutcomeCountShift
	if o.Pause {
		w |= OutcomePause
	}
	if o.Invalid {
		w |= OutcomeInvalid
	}
	return w
}

// UnpackOutcome decodes a word made by PackOutcome.
func UnpackOutcome(w int64) policy.Outcome {
	return policy.Outcome{
		DelayMs: w & delayMask,
		Reason:  policy.Reason(w >> OutcomeReasonShift & OutcomeReasonMask),
		Action:  policy.OutcomeAction(w >> OutcomeActionShift & OutcomeActionMask),
		Pause:   w&OutcomePause != 0,
		Count:   policy.Count(w >> OutcomeCountShift & OutcomeCountMask),
		Invalid: w&OutcomeInvalid != 0,
	}
}
