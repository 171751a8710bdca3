// Package queuemetrics holds the queue families a worker exports when the
// broker cannot count outcomes itself (RabbitMQ): the names the exporter
// gives the Redis stats hash, with a job_type label. Node and Python mirror
// them (queue/rabbitmq/README.md, "Counters and metrics"):
//
//	backstop_attempts_total{queue,job_type,outcome}       success, retry, dead_letter, deferred
//	backstop_retries_total{queue,job_type,reason}
//	backstop_deferrals_total{queue,job_type,reason}        circuit_open, budget_exhausted
//	backstop_dead_letters_total{queue,job_type,reason}
//	backstop_max_attempts_reached_total{queue,job_type}
//	backstop_job_attempts{queue,job_type,outcome}          histogram of the attempt a job finished on
//
// job_type is "" for an untyped job, the type's name for the first
// TypeLimit valid types a queue sees, and "other" for the rest.
package queuemetrics

import (
	"errors"
	"fmt"
	"sync"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// The outcomes of backstop_attempts_total.
const (
	Success    = "success"
	Retry      = "retry"
	DeadLetter = "dead_letter"
	Deferred   = "deferred"
)

// AttemptBuckets are backstop_job_attempts' upper bounds, for the workers
// and the exporter alike, so the rules' tail_attempts hold on both brokers.
var AttemptBuckets = []float64{1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50}

// TypeLimit is how many job types a queue labels by name; the others are
// "other" (as the Redis stats hash's DefaultTypeLimit).
const TypeLimit = 50

// Other is the job_type of types past TypeLimit and of invalid ones.
const Other = "other"

type families struct {
	attempts, retries, deferrals, deadLetters, maxAttempts *prometheus.CounterVec
	jobAttempts                                            *prometheus.HistogramVec
}

func newFamilies() *families {
	c := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, append([]string{"queue", "job_type"}, labels...))
	}
	return &families{
		attempts:    c("backstop_attempts_total", "Attempts by outcome (success, retry, dead_letter; deferred: a job the breaker or the budget refused, its attempt not spent), counted by the workers.", "outcome"),
		retries:     c("backstop_retries_total", "Retries scheduled, by the policy's reason.", "reason"),
		deferrals:   c("backstop_deferrals_total", "Jobs deferred without spending an attempt, by reason (circuit_open, budget_exhausted).", "reason"),
		deadLetters: c("backstop_dead_letters_total", "Jobs dead-lettered, by reason.", "reason"),
		maxAttempts: c("backstop_max_attempts_reached_total", "Jobs dead-lettered because they used up their attempts."),
		jobAttempts: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "backstop_job_attempts", Help: "The attempt on which each job finished, by outcome (success, dead_letter).",
			Buckets: AttemptBuckets,
		}, []string{"queue", "job_type", "outcome"}),
	}
}

var (
	mu         sync.Mutex
	registries = map[prometheus.Registerer]*families{}
	recorders  = map[prometheus.Registerer]map[string]*Recorder{}
)

// Bind returns the Recorder of queue in reg, registering the families on
// first use; later calls for reg reuse them (and the queue's Recorder, so
// its type limit is shared by every worker of the process).
//
// # Errors
//
// A nil reg, an empty or invalid UTF-8 queue name, or a registry holding
// other collectors under these names; who prefixes the message.
func Bind(reg prometheus.Registerer, queue, who string) (*Recorder, error) {
	switch {
	case reg == nil:
		return nil, fmt.Errorf("%s: registerer: must not be nil", who)
	case queue == "":
		return nil, fmt.Errorf("%s: queue: must not be empty", who)
	case !utf8.ValidString(queue):
		return nil, fmt.Errorf("%s: queue %q: not valid UTF-8", who, queue)
	}
	mu.Lock()
	defer mu.Unlock()
	if r := recorders[reg][queue]; r != nil {
		return r, nil
	}
	fam := registries[reg]
	if fam == nil {
		fam = newFamilies()
		for _, c := range []struct {
			name string
			ptr  *prometheus.CounterVec
			set  func(*prometheus.CounterVec)
		}{
			{"backstop_attempts_total", fam.attempts, func(v *prometheus.CounterVec) { fam.attempts = v }},
			{"backstop_retries_total", fam.retries, func(v *prometheus.CounterVec) { fam.retries = v }},
			{"backstop_deferrals_total", fam.deferrals, func(v *prometheus.CounterVec) { fam.deferrals = v }},
			{"backstop_dead_letters_total", fam.deadLetters, func(v *prometheus.CounterVec) { fam.deadLetters = v }},
			{"backstop_max_attempts_reached_total", fam.maxAttempts, func(v *prometheus.CounterVec) { fam.maxAttempts = v }},
		} {
			existing, err := register(reg, c.name, c.ptr, who)
			if err != nil {
				return nil, err
			}
			if existing != nil {
				v, ok := existing.(*prometheus.CounterVec)
				if !ok {
					return nil, fmt.Errorf("%s: register %s: the registry holds another collector of that name (%T)", who, c.name, existing)
				}
				c.set(v)
			}
		}
		existing, err := register(reg, "backstop_job_attempts", fam.jobAttempts, who)
		if err != nil {
			return nil, err
		}
		if existing != nil {
			v, ok := existing.(*prometheus.HistogramVec)
			if !ok {
				return nil, fmt.Errorf("%s: register backstop_job_attempts: the registry holds another collector of that name (%T)", who, existing)
			}
			fam.jobAttempts = v
		}
		registries[reg] = fam
		recorders[reg] = map[string]*Recorder{}
	}
	r := &Recorder{f: fam, queue: queue, types: map[string]bool{}}
	recorders[reg][queue] = r
	return r, nil
}

// register registers c, or returns the collector reg already holds under
// its name.
func register(reg prometheus.Registerer, name string, c prometheus.Collector, who string) (prometheus.Collector, error) {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		return are.ExistingCollector, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: register %s: %w", who, name, err)
	}
	return nil, nil
}

// Recorder counts one queue's outcomes. A nil *Recorder records nothing.
type Recorder struct {
	f     *families
	queue string
	mu    sync.Mutex
	types map[string]bool // types labelled by name
}

// jobType is the job_type label of t: "" untyped, t for the first
// TypeLimit valid types, else Other.
func (r *Recorder) jobType(t string, valid bool) string {
	if t == "" {
		return ""
	}
	if !valid {
		return Other
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.types[t] {
		return t
	}
	if len(r.types) >= TypeLimit {
		return Other
	}
	r.types[t] = true
	return t
}

// Job is what the Recorder needs of a job: its type, whether that type is
// valid (an invalid one counts as Other), and the attempt it ran.
type Job struct {
	Type      string
	ValidType bool
	Attempt   int64 // 0: unknown (a malformed message): not in backstop_job_attempts
}

// Success counts a job that succeeded on j.Attempt.
func (r *Recorder) Success(j Job) {
	if r == nil {
		return
	}
	t := r.jobType(j.Type, j.ValidType)
	r.f.attempts.WithLabelValues(r.queue, t, Success).Inc()
	r.finished(t, Success, j.Attempt)
}

// Retried counts a retry for reason.
func (r *Recorder) Retried(j Job, reason string) {
	if r == nil {
		return
	}
	t := r.jobType(j.Type, j.ValidType)
	r.f.attempts.WithLabelValues(r.queue, t, Retry).Inc()
	r.f.retries.WithLabelValues(r.queue, t, reason).Inc()
}

// Deferred counts a deferral (the attempt not spent) for reason.
func (r *Recorder) Deferred(j Job, reason string) {
	if r == nil {
		return
	}
	t := r.jobType(j.Type, j.ValidType)
	r.f.attempts.WithLabelValues(r.queue, t, Deferred).Inc()
	r.f.deferrals.WithLabelValues(r.queue, t, reason).Inc()
}

// DeadLettered counts a dead letter for reason (max_attempts_reached also
// counts in backstop_max_attempts_reached_total).
func (r *Recorder) DeadLettered(j Job, reason string) {
	if r == nil {
		return
	}
	t := r.jobType(j.Type, j.ValidType)
	r.f.attempts.WithLabelValues(r.queue, t, DeadLetter).Inc()
	r.f.deadLetters.WithLabelValues(r.queue, t, reason).Inc()
	if reason == "max_attempts_reached" {
		r.f.maxAttempts.WithLabelValues(r.queue, t).Inc()
	}
	r.finished(t, DeadLetter, j.Attempt)
}

func (r *Recorder) finished(t, outcome string, attempt int64) {
	if attempt >= 1 {
		r.f.jobAttempts.WithLabelValues(r.queue, t, outcome).Observe(float64(attempt))
	}
}
