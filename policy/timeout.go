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

// ConnectTimeoutMs returns the policy's connect_timeout (0: none, the
// client's own): how long establishing a connection may take within an
// attempt. It reads no state and never changes, so hosts read it once
// when they load a policy and hand it to the language's client (Go
// net.Dialer.Timeout, undici's connect.timeout, httpx.Timeout(connect=),
// HttpClient.Builder.connectTimeout); a connect that runs out fails with
// the error kind connect_timeout, not timeout.
func (p *Policy) ConnectTimeoutMs() int64 { return p.connectTimeoutMs }
