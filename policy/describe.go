package policy

import "strings"

// String summarises the policy in one line, as `backstop policy check`
// prints it.
func (p *Policy) String() string {
	var b strings.Builder
	if p.name != "" {
		b.WriteString(p.name + ": ")
	}
	if p.maxAttempts > 0 {
		b.WriteString("max attempts " + itoa(p.maxAttempts) + " (uncertain " + itoa(p.uncertainMaxAttempts) + ")")
	} else {
		b.WriteString("unlimited attempts (uncertain " + itoa(p.uncertainMaxAttempts) + ")")
	}
	if p.maxElapsedMs > 0 {
		b.WriteString(", max elapsed " + ms(p.maxElapsedMs))
	}
	if p.stopAll && p.maxAttempts > 0 && p.maxElapsedMs > 0 {
		b.WriteString(" (stop when both are reached)")
	}
	if p.attemptTimeoutMs > 0 {
		b.WriteString(", each attempt at most " + ms(p.attemptTimeoutMs))
	}
	if p.connectTimeoutMs > 0 {
		b.WriteString(", each connect at most " + ms(p.connectTimeoutMs))
	}
	b.WriteString("; " + strategyNames[p.strategy] + " backoff")
	switch p.strategy {
	case strategyExponential:
		b.WriteString(" base " + ms(p.baseMs) + " ×" + fmtFixed(p.multMilli, 3) + " cap " + ms(p.capMs) + " (max " + itoa(p.maxDoublings) + " doublings)")
	case strategyCloudTasks:
		b.WriteString(" base " + ms(p.baseMs) + " doubling " + itoa(p.maxDoublings) + " times, then +" + ms(p.exponential(p.maxDoublings)) + " per retry, cap " + ms(p.capMs))
	case strategyConstant, strategyLinear, strategyDecorrelated:
		b.WriteString(" base " + ms(p.baseMs) + " cap " + ms(p.capMs))
	}
	b.WriteString(", " + jitterNames[p.jitter] + " jitter")
	if p.jitter == jitterProportional {
		b.WriteString(" ±" + fmtFixed(p.ratioPPM, 6))
	}
	if p.hintHonor {
		b.WriteString("; Retry-After " + map[hintMode]string{hintMax: "max(hint, computed)", hintOnly: "as sent"}[p.hintMode] + ", cap " + ms(p.hintCapMs) + " (" + onExceedNames[p.hintOnExceed] + " beyond)")
	} else {
		b.WriteString("; Retry-After ignored")
	}
	if p.budget != nil {
		if p.budget.bucket {
			b.WriteString("; retry budget " + fmtFixed(p.budget.maxMilli, 3) + " tokens +" + fmtFixed(p.budget.ratioMill, 3) + " per success")
		} else {
			b.WriteString("; retry budget " + fmtFixed(p.budget.ratioPPM, 6) + " of requests over " + itoa(p.budget.windowSec) + "s (+" + itoa(p.budget.minPerSec) + "/s)")
		}
	}
	if c := p.circuit; c != nil && c.rate != nil {
		window := "the last " + itoa(c.rate.size) + " calls"
		if c.rate.byTime {
			window = "the calls of the last " + itoa(c.rate.size) + "s"
		}
		slow := ""
		if c.slow != nil {
			slow = " or " + itoa(c.slow.thresholdPct) + "% calls slower than " + ms(c.slowMs)
		}
		b.WriteString("; circuit breaker opens at " + itoa(c.rate.thresholdPct) + "% failures" + slow + " of " + window + " (at least " + itoa(c.rate.minCalls) + ") for " + ms(c.openMs))
	} else if c != nil {
		b.WriteString("; circuit breaker opens after " + itoa(c.threshold) + " failures for " + ms(c.openMs))
	}
	if p.retryDownstream { // the default, give_up, is said by docs/layers.md, not on every line
		b.WriteString("; a failure a layer below already retried is retried here")
	}
	return b.String()
}

// BackoffLimits returns the backoff cap and, for the exponential strategy,
// max_doublings (0 for the other strategies): the knees of a schedule.
func (p *Policy) BackoffLimits() (capMs, maxDoublings int64) {
	if p.strategy == strategyExponential || p.strategy == strategyCloudTasks {
		return p.capMs, p.maxDoublings
	}
	return p.capMs, 0
}

// MaxElapsedMs returns the elapsed-time limit (0: none).
func (p *Policy) MaxElapsedMs() int64 { return p.maxElapsedMs }

// StopWhen returns how the limits combine: "any" (the first one reached
// stops retrying, the default) or "all" (every limit set must have passed).
func (p *Policy) StopWhen() string { return stopWhenNames[b2i(p.stopAll)] }

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Step is one row of a schedule: the wait after a failure of Attempt, at
// the low, middle and high end of the jitter, and the total waited so far.
type Step struct {
	Attempt                int64
	MinMs, MedianMs, MaxMs int64
	CumMinMs, CumMedianMs  int64
	CumMaxMs               int64
}

// Schedule returns the backoff schedule for retryable failures, up to the
// attempt limit (or limit rows), ignoring Retry-After and the state. Rows
// whose earliest due time passes max elapsed are left out; with stop_when
// all, rows go on until the attempts are used up and the shortest total
// wait has passed max elapsed.
//
// With unlimited attempts and a jitter whose shortest wait is 0 (full),
// the earliest due time never passes max elapsed: only limit ends the
// schedule, so bound it (backstop policy check allows 10000 rows).
func (p *Policy) Schedule(limit int) []Step {
	var out []Step
	var prev [3]int64
	var cum [3]int64
	for a := int64(1); len(out) < limit; a++ {
		attemptsDone := p.maxAttempts > 0 && a >= p.maxAttempts
		if p.stopAll {
			// Every limit set must have passed, at the failure.
			elapsedDone := p.maxElapsedMs == 0 || cum[0] > p.maxElapsedMs
			if (attemptsDone || p.maxAttempts == 0) && elapsedDone {
				break
			}
		} else if attemptsDone {
			break
		}
		var d [3]int64
		for i, r := range []float64{0, 0.5, 1} {
			d[i] = p.Backoff(a, prev[i], r)
			prev[i] = d[i]
		}
		if p.maxElapsedMs > 0 && !p.stopAll && satAdd(cum[0], d[0]) > p.maxElapsedMs {
			break
		}
		for i := range cum {
			cum[i] = satAdd(cum[i], d[i])
		}
		out = append(out, Step{Attempt: a, MinMs: d[0], MedianMs: d[1], MaxMs: d[2], CumMinMs: cum[0], CumMedianMs: cum[1], CumMaxMs: cum[2]})
	}
	return out
}
