// Package clientmetrics holds the process metrics (backstop_client_*) of Go:
// the retry loop (package retry) and the queue workers (package queue)
// record through the same Recorder. Node (createMetrics) and Python
// (backstop.metrics) export the same families, labels and buckets;
// testdata/metrics holds the sequence every language replays and the
// exposition it must give.
package clientmetrics

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/backstop-dev/backstop/policy"
)

// The process metrics: the same families, labels and buckets in Go, Node
// (createMetrics) and Python (backstop.metrics); testdata/metrics holds the
// sequence every language replays and the exposition it must give.
// The outcomes of an attempt.
const (
	OutcomeSuccess    = "success"
	OutcomeRetry      = "retry"
	OutcomeDeadLetter = "dead_letter"
	OutcomeRefused    = "refused"
)

// delayBuckets are the retry_delay_seconds buckets: from 10 ms to 5 min,
// the range of backoff delays.
var delayBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}

var circuitStates = [...]string{"closed", "open", "half_open"}

// families are one registry's collectors.
type families struct {
	attempts    *prometheus.CounterVec
	retries     *prometheus.CounterVec
	refused     *prometheus.CounterVec
	delay       *prometheus.HistogramVec
	latency     *prometheus.HistogramVec
	state       *prometheus.GaugeVec
	transitions *prometheus.CounterVec
	budget      *prometheus.GaugeVec

	mu    sync.Mutex
	bound map[[2]string]*Recorder
}

func newFamilies() *families {
	pt := []string{"policy", "target"}
	return &families{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "backstop_client_attempts_total",
			Help: "Calls made (or refused) under a backstop policy, by outcome: success, retry, dead_letter, refused.",
		}, append(pt, "outcome")),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "backstop_client_retries_total",
			Help: "Retries scheduled, by the policy's reason.",
		}, append(pt, "reason")),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "backstop_client_calls_refused_total",
			Help: "Calls refused before they were made, by reason: circuit_open, budget_exhausted.",
		}, append(pt, "reason")),
		delay: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "backstop_client_retry_delay_seconds",
			Help:    "Delay scheduled before each retry.",
			Buckets: delayBuckets,
		}, pt),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "backstop_client_retry_latency_seconds",
			Help:    "Measured time from a failed attempt to the start of the next one (the decided delay is backstop_client_retry_delay_seconds).",
			Buckets: delayBuckets,
		}, pt),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "backstop_client_circuit_state",
			Help: "Circuit breaker state last seen by this process: 1 for the current state, 0 for the others.",
		}, append(pt, "state")),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "backstop_client_circuit_transitions_total",
			Help: "Circuit breaker state changes seen by this process.",
		}, append(pt, "from", "to")),
		budget: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "backstop_client_budget_tokens",
			Help: "Retry budget left as last seen by this process: a token bucket's tokens (retries pass while more than half remain), or the retries a window budget still allows. Absent without a budget.",
		}, pt),
		bound: map[[2]string]*Recorder{},
	}
}

// register registers out's collectors in reg, or returns the ones reg
// already holds under the same names.
func (out *families) register(reg prometheus.Registerer, who string) (*families, error) {
	for _, c := range []struct {
		name string
		ptr  any
	}{
		{"backstop_client_attempts_total", &out.attempts},
		{"backstop_client_retries_total", &out.retries},
		{"backstop_client_calls_refused_total", &out.refused},
		{"backstop_client_retry_delay_seconds", &out.delay},
		{"backstop_client_retry_latency_seconds", &out.latency},
		{"backstop_client_circuit_state", &out.state},
		{"backstop_client_circuit_transitions_total", &out.transitions},
		{"backstop_client_budget_tokens", &out.budget},
	} {
		if err := registerOne(reg, c.name, c.ptr, who); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func registerOne(reg prometheus.Registerer, name string, ptr any, who string) error {
	var col prometheus.Collector
	switch p := ptr.(type) {
	case **prometheus.CounterVec:
		col = *p
	case **prometheus.HistogramVec:
		col = *p
	case **prometheus.GaugeVec:
		col = *p
	}
	err := reg.Register(col)
	var are prometheus.AlreadyRegisteredError
	if !errors.As(err, &are) {
		if err != nil {
			return fmt.Errorf("%s: register %s: %w", who, name, err)
		}
		return nil
	}
	ok := false
	switch p := ptr.(type) {
	case **prometheus.CounterVec:
		*p, ok = are.ExistingCollector.(*prometheus.CounterVec)
	case **prometheus.HistogramVec:
		*p, ok = are.ExistingCollector.(*prometheus.HistogramVec)
	case **prometheus.GaugeVec:
		*p, ok = are.ExistingCollector.(*prometheus.GaugeVec)
	}
	if !ok {
		return fmt.Errorf("%s: register %s: the registry holds another collector of that name (%T)", who, name, are.ExistingCollector)
	}
	return nil
}

var (
	registriesMu sync.Mutex
	registries   = map[prometheus.Registerer]*families{}
)

// Bind returns the Recorder of policyName and target in reg, registering
// the families on first use; later calls on reg reuse them.
//
// # Errors
//
// An empty or invalid UTF-8 label value, a nil reg, or a registry that holds
// other collectors under the same names; who prefixes the message.
func Bind(reg prometheus.Registerer, policyName, target, who string) (*Recorder, error) {
	for _, l := range []struct{ name, v string }{{"policy", policyName}, {"target", target}} {
		switch {
		case l.v == "":
			return nil, fmt.Errorf("%s: %s: must not be empty", who, l.name)
		case !utf8.ValidString(l.v):
			return nil, fmt.Errorf("%s: %s %q: not valid UTF-8", who, l.name, l.v)
		}
	}
	if reg == nil {
		return nil, fmt.Errorf("%s: registerer: must not be nil", who)
	}
	registriesMu.Lock()
	defer registriesMu.Unlock()
	fam := registries[reg]
	if fam == nil {
		var err error
		if fam, err = newFamilies().register(reg, who); err != nil {
			return nil, err
		}
		registries[reg] = fam
	}
	return fam.bind(policyName, target), nil
}

// Recorder holds one policy and target's series.
type Recorder struct {
	attempts map[string]prometheus.Counter
	delay    prometheus.Observer
	latency  prometheus.Observer
	fam      *families
	policy   string
	target   string
	last     atomic.Int32 // last state seen, -1: none
}

func (f *families) bind(pol, target string) *Recorder {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.bound[[2]string{pol, target}]; r != nil {
		return r
	}
	r := &Recorder{attempts: map[string]prometheus.Counter{}, fam: f, policy: pol, target: target,
		delay: f.delay.WithLabelValues(pol, target), latency: f.latency.WithLabelValues(pol, target)}
	r.last.Store(-1)
	for _, o := range []string{OutcomeSuccess, OutcomeRetry, OutcomeDeadLetter, OutcomeRefused} {
		r.attempts[o] = f.attempts.WithLabelValues(pol, target, o)
	}
	f.bound[[2]string{pol, target}] = r
	return r
}

// The methods below do nothing on a nil Recorder (no metrics asked for).

// Attempt counts one attempt's outcome.
func (r *Recorder) Attempt(outcome string) {
	if r != nil {
		r.attempts[outcome].Inc()
	}
}

// Retry counts a retry scheduled after delay.
func (r *Recorder) Retry(reason string, delay time.Duration) {
	if r != nil {
		r.fam.retries.WithLabelValues(r.policy, r.target, reason).Inc()
		r.delay.Observe(delay.Seconds())
	}
}

// Latency records the measured time from a failed attempt to the start of
// the next one: the decided delay (Retry) plus however late the retry
// started (a stalled promoter or mover, a busy worker, a slow sleep).
func (r *Recorder) Latency(d time.Duration) {
	if r != nil {
		r.latency.Observe(max(0, d).Seconds())
	}
}

// Refused counts a call refused before it was made.
func (r *Recorder) Refused(reason string) {
	if r != nil {
		r.attempts[OutcomeRefused].Inc()
		r.fam.refused.WithLabelValues(r.policy, r.target, reason).Inc()
	}
}

// Budget records the retry budget left, in milli-units
// (policy.Policy.BudgetTokens).
func (r *Recorder) Budget(milli int64) {
	if r != nil {
		r.fam.budget.WithLabelValues(r.policy, r.target).Set(float64(milli) / 1000)
	}
}

// State records the breaker's state s, and a transition from the last one.
func (r *Recorder) State(s policy.CircuitState) {
	if r == nil || int(s) >= len(circuitStates) {
		return
	}
	prev := r.last.Swap(int32(s))
	if prev == int32(s) {
		return
	}
	for i, name := range circuitStates {
		v := 0.0
		if i == int(s) {
			v = 1
		}
		r.fam.state.WithLabelValues(r.policy, r.target, name).Set(v)
	}
	if prev >= 0 {
		r.fam.transitions.WithLabelValues(r.policy, r.target, circuitStates[prev], circuitStates[s]).Inc()
	}
}
