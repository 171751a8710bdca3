package exporter

import (
	"errors"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/backstop-dev/backstop/internal/queuemetrics"
	"github.com/backstop-dev/backstop/internal/resp"
)

var (
	attemptsDesc    = newDesc("attempts_total", "Attempts by outcome (success, retry, dead_letter; deferred: a job the breaker or the budget refused, its attempt not spent), counted by the queue scripts. job_type: the job's type, \"other\" for types past the queue's registry or malformed, \"\" for untyped jobs.", "queue", "outcome", "job_type")
	retriesDesc     = newDesc("retries_total", "Retries scheduled, by the policy's reason (transient, retry_after, uncertain) and job type.", "queue", "reason", "job_type")
	deadLettersDesc = newDesc("dead_letters_total", "Jobs dead-lettered, by reason and job type.", "queue", "reason", "job_type")
	deferralsDesc   = newDesc("deferrals_total", "Jobs deferred to the delayed set without spending an attempt, by reason (circuit_open, budget_exhausted) and job type: waiting out an outage, not retries.", "queue", "reason", "job_type")
	maxAttemptsDesc = newDesc("max_attempts_reached_total", "Jobs dead-lettered because they used up their attempts, by job type.", "queue", "job_type")
	jobAttemptsDesc = newDesc("job_attempts", "The attempt on which each job finished, by outcome (success, dead_letter) and job type.", "queue", "outcome", "job_type").asHistogram()
	jobTypesDesc    = newDesc("job_types", "Job types the queue's scripts count by name (its stats hash's type registry); jobs of any other type are counted as job_type=\"other\".", "queue")
	typesOverDesc   = newDesc("job_types_overflow_total", "Counted events of jobs whose type the full registry could not take (types:limit, default 50): counted as job_type=\"other\".", "queue")
	enqueuedDesc    = newDesc("enqueued_total", "Jobs enqueued.", "queue")
	promotedDesc    = newDesc("promoted_total", "Delayed jobs moved back to the jobs stream when due.", "queue")
	reclaimedDesc   = newDesc("reclaimed_total", "Entries reclaimed from crashed consumers.", "queue")
	replayedDesc    = newDesc("replayed_total", "Dead letters replayed to the jobs stream.", "queue")
	discardedDesc   = newDesc("dlq_discarded_total", "Dead letters an operator discarded for good (backstop dlq delete, dlq purge), each recorded first in the audit stream {Q}:audit (RabbitMQ: the queue Q.audit).", "queue")
	forceRunDesc    = newDesc("force_run_total", "Delayed jobs an operator moved to the jobs stream before they were due (backstop queue run).", "queue")
	skippedDesc     = newDesc("reclaim_skipped_total", "Crash loops reclaim could not dead-letter (the DLQ refused them: a key of the wrong type, an entry too large, Redis out of memory); each stays pending and is tried again.", "queue")
)

// plainCounters are the stats fields that map one to one to a counter,
// reported (0 when absent) once a queue has a stats hash.
var plainCounters = []struct {
	field string
	desc  *desc
}{
	{"enqueued", enqueuedDesc}, {"promoted", promotedDesc}, {"reclaimed", reclaimedDesc},
	{"reclaim_skipped", skippedDesc}, {"replayed", replayedDesc}, {"discarded", discardedDesc}, {"force_run", forceRunDesc},
}

// outcomes are always reported once a queue has a stats hash, so rate()
// sees the first attempt of each.
var outcomes = []string{"success", "retry", "dead_letter"}

// attemptBuckets are the upper bounds of backstop_job_attempts, the same
// as the workers' (a RabbitMQ queue's histogram comes from them). The stats
// hash counts attempts 1..64 exactly and "inf" above.
var attemptBuckets = queuemetrics.AttemptBuckets

// maxStatsLabels bounds the label values one queue's stats hash gives each
// metric (reasons of retries_total and dead_letters_total, outcomes of
// attempts_total and job_attempts): the scripts write the reasons they
// are given, and a caller that passes an error message as the reason
// would otherwise grow the exporter's memory, and Prometheus's, without
// bound. Past it the values that sort last are left out and
// backstop_scrape_limit_reached{limit="stats_labels"} says so.
const maxStatsLabels = 64

// maxJobTypes bounds the job types one queue's stats hash gives the
// per-type series: the scripts' registry holds 50 by default, but
// types:limit may be set to any number. Past it the types that sort last
// are counted under "other" (so every sum stays exact) and
// backstop_scrape_limit_reached{limit="job_types"} says so.
const maxJobTypes = 100

// otherType is the job_type of the jobs the scripts count but not by name.
const otherType = "other"

// readStats reads the stats hash (queue/redisqueue/README.md, "Counters") with one
// HGETALL: its size depends on the reasons, attempt numbers and job types
// seen, not on the queue's length. A queue that never used the scripts
// has none and gives no counters. Fields it does not know, or that are not
// numbers, are skipped: a newer script may add some. So are labels that
// are not valid label values (validName).
//
// The queue's totals count every job; the fields t:<T>:… count the jobs of
// type T again. Each per-type series comes from its fields, and the
// job_type="" series from the totals minus every type's: sum by (queue)
// is the totals, whatever the types.
func readStats(p *resp.Pipe, q Queue, pl plan) func(*sink) {
	key := q.Keys.Stats
	if key == "" {
		return nil
	}
	hash := statsHash(p, key, pl) // shared with readDLQ
	return func(s *sink) {
		fields := p.Reply(hash)
		if err := fields.Err(); err != nil {
			s.fail(q, key, err)
			return
		}
		if fields.Len() <= 0 {
			return
		}
		plain := make([]float64, len(plainCounters))
		total := pl.totals.reuse()
		var typed map[string]*counts // nil for a queue without typed jobs
		var types, overflow float64
		registry := false
		fields.Pairs(func(kr, vr resp.Reply) {
			v, ok := vr.Float()
			if !ok || v < 0 {
				return
			}
			k := pl.intern(kr.Bytes())
			kind, label, found := strings.Cut(k, ":")
			switch {
			case !found:
				for i, c := range plainCounters {
					if c.field == k {
						plain[i] = v
					}
				}
				switch k {
				case "max_attempts_reached":
					total.maxAttempts = v
				case "types":
					types, registry = v, true
				}
			case kind == "t":
				// t:<T>:<field as the totals name it>; a type has no ":".
				t, rest, ok := strings.Cut(label, ":")
				if !ok || validName(t) != nil {
					return
				}
				tc := typed[t]
				if tc == nil {
					c := makeCounts()
					tc = &c
				}
				if tc.add(rest, v) { // a type with no counter it knows has no series
					if typed == nil {
						typed = map[string]*counts{}
					}
					typed[t] = tc
				}
			case k == "types:overflow":
				overflow = v
			default:
				total.add(k, v)
			}
		})
		for i, c := range plainCounters {
			s.counter(c.desc, plain[i], q.Name)
		}
		if registry || typed != nil {
			s.gauge(jobTypesDesc, types, q.Name)
			s.counter(typesOverDesc, overflow, q.Name)
		}
		names := jobTypes(s, typed)
		consistent := true
		for _, t := range names {
			consistent = total.subtract(typed[t]) && consistent
		}
		if !consistent {
			// A hash edited by hand, or written by scripts of another
			// version: the rest is clamped, never negative.
			if _, ok := s.kinds[kindStats]; !ok {
				s.kinds[kindStats] = errors.New("stats hash " + key + ": per-type counters exceed the queue's totals")
			}
			s.log.Warn("stats hash inconsistent", "queue", q.Name, "key", key, "err", "per-type counters exceed the queue's totals: the untyped rest is clamped to 0")
		}
		total.emit(s, q.Name, "")
		for _, t := range names {
			typed[t].emit(s, q.Name, t)
		}
	}
}

// jobTypes returns the job types of typed to report, sorted: all of them,
// or past maxJobTypes "other" and the first others by name, the rest
// counted into "other" (which it says in s).
func jobTypes(s *sink, typed map[string]*counts) []string {
	if len(typed) == 0 {
		return nil
	}
	names := slices.Sorted(maps.Keys(typed))
	if len(names) <= maxJobTypes {
		return names
	}
	s.reached(limitJobTypes)
	other := typed[otherType]
	if other == nil {
		c := makeCounts()
		other = &c
		typed[otherType] = other
	}
	kept := []string{otherType}
	for _, t := range names {
		switch {
		case t == otherType:
		case len(kept) < maxJobTypes:
			kept = append(kept, t)
		default:
			other.merge(typed[t])
		}
	}
	slices.Sort(kept)
	return kept
}

// counts are the counters of a stats hash for one set of jobs: the
// queue's totals, or one job type's.
type counts struct {
	maxAttempts                               float64
	attempts, retries, deadLetters, deferrals map[string]float64
	finished                                  map[string]*finishedJobs // by outcome
}

// reuse returns c emptied for the next queue, keeping its maps' memory
// (the stats readers of a scrape run one after the other, and emit copies
// every figure but the histograms', whose finishedJobs are new each
// time); a new counts when c is nil.
func (c *counts) reuse() *counts {
	if c == nil {
		n := makeCounts()
		return &n
	}
	c.maxAttempts = 0
	clear(c.attempts)
	clear(c.retries)
	clear(c.deadLetters)
	clear(c.deferrals)
	clear(c.finished)
	return c
}

func makeCounts() counts {
	return counts{attempts: map[string]float64{}, retries: map[string]float64{}, deadLetters: map[string]float64{},
		deferrals: map[string]float64{}, finished: map[string]*finishedJobs{}}
}

// add reads one field, named as in the totals (attempts:success,
// finished:success:3, max_attempts_reached…), and says whether it knew it.
func (c *counts) add(field string, v float64) bool {
	kind, label, _ := strings.Cut(field, ":")
	switch {
	case field == "max_attempts_reached":
		c.maxAttempts = v
	case kind == "finished":
		outcome, attempt, ok := strings.Cut(label, ":")
		if !ok || validName(outcome) != nil {
			return false
		}
		c.jobs(outcome).add(attempt, v)
	case validName(label) != nil:
		return false
	case kind == "attempts":
		c.attempts[label] = v
	case kind == "retries":
		c.retries[label] = v
	case kind == "dead_letters":
		c.deadLetters[label] = v
	case kind == "deferred":
		c.deferrals[label] = v
	case kind == "finished_sum":
		c.jobs(label).sum = v
	default:
		return false
	}
	return true
}

func (c *counts) jobs(outcome string) *finishedJobs {
	if c.finished[outcome] == nil {
		c.finished[outcome] = &finishedJobs{per: make([]uint64, len(attemptBuckets)+1)}
	}
	return c.finished[outcome]
}

func (c *counts) maps(o *counts) [][2]map[string]float64 {
	return [][2]map[string]float64{{c.attempts, o.attempts}, {c.retries, o.retries}, {c.deadLetters, o.deadLetters}, {c.deferrals, o.deferrals}}
}

// merge adds o's counts to c's.
func (c *counts) merge(o *counts) {
	c.maxAttempts += o.maxAttempts
	for _, m := range c.maps(o) {
		for k, v := range m[1] {
			m[0][k] += v
		}
	}
	for outcome, f := range o.finished {
		cf := c.jobs(outcome)
		for i, n := range f.per {
			cf.per[i] += n
		}
		cf.sum += f.sum
	}
}

// subtract takes o's counts out of c's, leaving 0 where o counts more
// than c (and returning false).
func (c *counts) subtract(o *counts) (ok bool) {
	ok = true
	sub := func(a, b float64) float64 {
		if b > a {
			ok = false
			return 0
		}
		return a - b
	}
	c.maxAttempts = sub(c.maxAttempts, o.maxAttempts)
	for _, m := range c.maps(o) {
		for k, v := range m[1] {
			m[0][k] = sub(m[0][k], v)
		}
	}
	for outcome, f := range o.finished {
		cf := c.jobs(outcome)
		for i, n := range f.per {
			if n > cf.per[i] {
				ok, cf.per[i] = false, 0
			} else {
				cf.per[i] -= n
			}
		}
		cf.sum = sub(cf.sum, f.sum)
	}
	return ok
}

// emit adds c's series with the label job_type=jobType.
func (c *counts) emit(s *sink, queue, jobType string) {
	s.counter(maxAttemptsDesc, c.maxAttempts, queue, jobType)
	for _, o := range outcomes {
		c.attempts[o] += 0
	}
	for _, m := range []struct {
		d      *desc
		values map[string]float64
		always []string
	}{{attemptsDesc, c.attempts, outcomes}, {retriesDesc, c.retries, nil}, {deadLettersDesc, c.deadLetters, nil}, {deferralsDesc, c.deferrals, nil}} {
		for _, label := range bounded(s, m.values, m.always) {
			s.counter(m.d, m.values[label], queue, label, jobType)
		}
	}
	for _, o := range bounded(s, c.finished, outcomes) {
		f := c.finished[o]
		for i := 1; i < len(f.per); i++ {
			f.per[i] += f.per[i-1] // now cumulative
		}
		s.histogram(jobAttemptsDesc, attemptBuckets, f.per[:len(attemptBuckets)], f.per[len(attemptBuckets)], f.sum, queue, o, jobType)
	}
}

// bounded returns at most maxStatsLabels keys of m: those of always that
// m has, then the others, sorted. When it leaves some out it says so in s.
func bounded[V any](s *sink, m map[string]V, always []string) []string {
	if len(m) <= maxStatsLabels {
		keys := s.keys[:0] // the sink's scratch: the caller is done with it before the next call
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		s.keys = keys
		return keys
	}
	s.reached(limitStatsLabels)
	var keys []string
	for _, k := range always {
		if _, ok := m[k]; ok {
			keys = append(keys, k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if len(keys) == maxStatsLabels {
			break
		}
		if !slices.Contains(always, k) {
			keys = append(keys, k)
		}
	}
	return keys
}

// finishedJobs counts the jobs of one outcome by the attempt they finished on.
type finishedJobs struct {
	per []uint64 // jobs per bucket (previous bound, bound], the last +Inf
	sum float64
}

// add counts jobs that finished on attempt ("1".."64", or "inf").
func (f *finishedJobs) add(attempt string, jobs float64) {
	n := math.Inf(1)
	if attempt != "inf" {
		var err error
		if n, err = strconv.ParseFloat(attempt, 64); err != nil {
			return
		}
	}
	i, _ := slices.BinarySearch(attemptBuckets, n)
	f.per[i] += uint64(jobs)
}
