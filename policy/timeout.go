package policy

// AttemptTimeout returns how long the attempt about to start may run, in
// ms, elapsedMs after the first attempt started: attempt_timeout, cut to
// what is left of max_elapsed (stop_when any: a retry loop gives up at the
// deadline, so an attempt running past it is wasted), at least 1 ms once
// either applies. 0 means no timeout. A negative elapsedMs is an
// *InputError.
func (p *Policy) AttemptTimeout(elapsedMs int64) (int64, error) {
	if elapsedMs < 0 {
		return 0, inputError("elapsed_ms", "must be >= 0 (got "+itoa(elapsedMs)+")")
	}
	t := p.attemptTimeoutMs
	if p.maxElapsedMs > 0 && !p.stopAll {
		if left := max(p.maxElapsedMs-elapsedMs, 1); t == 0 || left < t {
			t = left
		}
	}
	return t, nil
}

// AttemptTimeoutMs returns the policy's attempt_timeout (0: none).
func (p *Policy) AttemptTimeoutMs() int64 { return p.attemptTimeoutMs }
