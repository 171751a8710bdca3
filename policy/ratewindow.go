package policy

// Bounds of a failure_rate breaker's sliding window: its memory is a ring
// of at most this many buckets (one per call, or one per second).
const (
	// MaxWindowCalls bounds circuit_breaker.sliding_window.size for a
	// count window: the last N calls, one bucket each.
	MaxWindowCalls = 1000
	// MaxWindowSeconds bounds it for a time window: the calls of the last
	// T seconds, one bucket per second.
	MaxWindowSeconds = 600
)

// rateWindow is the sliding window of a failure_rate breaker, as
// Resilience4j's: over the last size calls (count) or the calls of the
// last size seconds (time), the breaker opens when at least minCalls were
// recorded and failures × 100 >= thresholdPct × calls. Integer counts
// only, so every build opens it on the same call.
type rateWindow struct {
	byTime       bool
	size         int64 // calls, or seconds
	minCalls     int64
	thresholdPct int64

	// count: a ring of the last size outcomes
	failed   []bool
	next     int64 // where the next outcome goes
	filled   int64 // outcomes in the ring (≤ size)
	failures int64 // failed ones among them

	// time: a ring of one-second buckets
	buckets []rateBucket
}

type rateBucket struct {
	sec             int64
	calls, failures int64
}

func newRateWindow(byTime bool, size, minCalls, thresholdPct int64) *rateWindow {
	w := &rateWindow{byTime: byTime, size: size, minCalls: minCalls, thresholdPct: thresholdPct}
	if byTime {
		w.buckets = make([]rateBucket, size)
	} else {
		w.failed = make([]bool, size)
	}
	return w
}

// record adds one call's outcome at nowMs, and reports whether the window
// now says open.
func (w *rateWindow) record(nowMs int64, failed bool) bool {
	f := int64(0)
	if failed {
		f = 1
	}
	if !w.byTime {
		if w.filled == w.size {
			if w.failed[w.next] {
				w.failures--
			}
		} else {
			w.filled++
		}
		w.failed[w.next] = failed
		w.failures += f
		w.next = (w.next + 1) % w.size
		return w.trips(w.filled, w.failures)
	}
	sec := nowMs / 1000
	b := &w.buckets[sec%w.size]
	switch {
	case sec > b.sec:
		*b = rateBucket{sec: sec}
	case sec < b.sec:
		// A clock that stepped back past the window: the bucket holds a
		// newer second, so this call is older than the window.
		return false
	}
	b.calls++
	b.failures += f
	calls, failures := w.sum(sec)
	return w.trips(calls, failures)
}

// sum counts the calls of the seconds (sec-size, sec].
func (w *rateWindow) sum(sec int64) (calls, failures int64) {
	for i := range w.buckets {
		if b := &w.buckets[i]; b.sec > sec-w.size && b.sec <= sec {
			calls += b.calls
			failures += b.failures
		}
	}
	return calls, failures
}

func (w *rateWindow) trips(calls, failures int64) bool {
	return calls >= w.minCalls && failures*100 >= w.thresholdPct*calls
}

// reset forgets every call: the window starts afresh when the breaker
// changes state, as Resilience4j's does.
func (w *rateWindow) reset() {
	clear(w.failed)
	clear(w.buckets)
	w.next, w.filled, w.failures = 0, 0, 0
}
