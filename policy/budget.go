package policy

// budget limits retries to a share of traffic, so a fleet cannot multiply
// its load on a dependency that is already failing. Two kinds:
//
//   - token bucket, as gRPC retry throttling (gRFC A6): every retryable
//     failure takes one token, every success gives back token_ratio, and
//     retries are allowed only while more than half the tokens remain;
//   - ratio over a window, as Finagle's RetryBudget: every reported outcome
//     deposits a request, every granted retry withdraws one, and retries in
//     the window may not exceed ratio × requests + min_per_second × window.
//
// Amounts are integer milli-units, so the state evolves identically in
// every build.
type budget struct {
	// token bucket
	bucket    bool
	maxMilli  int64
	ratioMill int64
	tokens    int64

	// ratio over a window of one-second slots
	ratioPPM  int64
	windowSec int64
	minPerSec int64
	slots     [maxWindowSec]budgetSlot
}

const maxWindowSec = 60

type budgetSlot struct {
	sec               int64
	requests, retries int64
}

func (b *budget) onFailure(nowMs int64) {
	if b.bucket {
		b.tokens = max(0, b.tokens-1000)
		return
	}
	b.slot(nowMs).requests++
}

func (b *budget) onSuccess(nowMs int64) {
	if b.bucket {
		b.tokens = min(b.maxMilli, b.tokens+b.ratioMill)
		return
	}
	b.slot(nowMs).requests++
}

// withdraw reports whether one more retry fits the budget, and counts it.
func (b *budget) withdraw(nowMs int64) bool {
	if b.bucket {
		return b.tokens > b.maxMilli/2
	}
	if b.remaining(nowMs) <= 0 {
		return false
	}
	b.slot(nowMs).retries++
	return true
}

// remaining returns how many more retries the window at nowMs allows (a
// window budget), without changing anything.
func (b *budget) remaining(nowMs int64) int64 {
	now := nowMs / 1000
	var requests, retries int64
	for i := range b.slots[:b.windowSec] {
		if s := &b.slots[i]; s.sec > now-b.windowSec && s.sec <= now {
			requests += s.requests
			retries += s.retries
		}
	}
	return b.minPerSec*b.windowSec + mulDiv(requests, b.ratioPPM, 1_000_000) - retries
}

// available is Policy.BudgetTokens: the bucket's milli-tokens, or the
// window's remaining retries × 1000.
func (b *budget) available(nowMs int64) int64 {
	if b.bucket {
		return b.tokens
	}
	return satMul(max(b.remaining(nowMs), 0), 1000)
}

// slot returns the slot of nowMs's second, starting it afresh when the
// slot last held an older second. A clock that stepped back counts into
// the slot it finds rather than erasing newer counts.
func (b *budget) slot(nowMs int64) *budgetSlot {
	sec := nowMs / 1000
	s := &b.slots[sec%b.windowSec]
	if sec > s.sec {
		*s = budgetSlot{sec: sec}
	}
	return s
}
