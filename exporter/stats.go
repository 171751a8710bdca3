package exporter

import (
	"context"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

var (
	attemptsDesc    = newDesc("attempts_total", "Attempts by outcome (success, retry, dead_letter; deferred: a job the breaker or the budget refused, its attempt not spent), counted by the queue scripts.", "queue", "outcome")
	retriesDesc     = newDesc("retries_total", "Retries scheduled, by the policy's reason (transient, retry_after, uncertain).", "queue", "reason")
	deadLettersDesc = newDesc("dead_letters_total", "Jobs dead-lettered, by reason.", "queue", "reason")
	deferralsDesc   = newDesc("deferrals_total", "Jobs deferred to the delayed set without spending an attempt, by reason (circuit_open, budget_exhausted): waiting out an outage, not retries.", "queue", "reason")
	maxAttemptsDesc = newDesc("max_attempts_reached_total", "Jobs dead-lettered because they used up their attempts.", "queue")
	jobAttemptsDesc = newDesc("job_attempts", "The attempt on which each job finished, by outcome (success, dead_letter).", "queue", "outcome")
	enqueuedDesc    = newDesc("enqueued_total", "Jobs enqueued.", "queue")
	promotedDesc    = newDesc("promoted_total", "Delayed jobs moved back to the jobs stream when due.", "queue")
	reclaimedDesc   = newDesc("reclaimed_total", "Entries reclaimed from crashed consumers.", "queue")
	replayedDesc    = newDesc("replayed_total", "Dead letters replayed to the jobs stream.", "queue")
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
	{"reclaim_skipped", skippedDesc}, {"replayed", replayedDesc}, {"max_attempts_reached", maxAttemptsDesc},
	{"force_run", forceRunDesc},
}

// outcomes are always reported once a queue has a stats hash, so rate()
// sees the first attempt of each.
var outcomes = []string{"success", "retry", "dead_letter"}

// attemptBuckets are the upper bounds of backstop_job_attempts. The stats
// hash counts attempts 1..64 exactly and "inf" above.
var attemptBuckets = []float64{1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50}

// maxStatsLabels bounds the label values one queue's stats hash gives each
// metric (reasons of retries_total and dead_letters_total, outcomes of
// attempts_total and job_attempts): the scripts write the reasons they
// are given, and a caller that passes an error message as the reason
// would otherwise grow the exporter's memory, and Prometheus's, without
// bound. Past it the values that sort last are left out and
// backstop_scrape_limit_reached{limit="stats_labels"} says so.
const maxStatsLabels = 64

// readStats reads the stats hash (queue/README.md, "Counters") with one
// HGETALL: its size depends on the reasons and attempt numbers seen, not on
// the queue's length. A queue that never used the scripts has none and
// gives no counters. Fields it does not know, or that are not numbers, are
// skipped: a newer script may add some. So are labels that are not valid
// label values (validName).
func readStats(ctx context.Context, p redis.Pipeliner, q Queue, pl plan) func(*sink) {
	key := q.Keys.Stats
	if key == "" {
		return nil
	}
	hash := statsHash(ctx, p, key, pl) // shared with readDLQ
	return func(s *sink) {
		fields, err := hash.Result()
		if err != nil {
			s.fail(q, key, err)
			return
		}
		if len(fields) == 0 {
			return
		}
		plain := make([]float64, len(plainCounters))
		attempts := map[string]float64{}
		retries := map[string]float64{}
		deadLetters := map[string]float64{}
		deferrals := map[string]float64{}
		finished := map[string]*finishedJobs{}
		jobs := func(outcome string) *finishedJobs {
			if finished[outcome] == nil {
				finished[outcome] = &finishedJobs{per: make([]uint64, len(attemptBuckets)+1)}
			}
			return finished[outcome]
		}
		for k, raw := range fields {
			v, err := strconv.ParseFloat(raw, 64)
			if err != nil || v < 0 {
				continue
			}
			kind, label, found := strings.Cut(k, ":")
			switch {
			case !found:
				for i, c := range plainCounters {
					if c.field == k {
						plain[i] = v
					}
				}
			case kind == "finished":
				if outcome, attempt, ok := strings.Cut(label, ":"); ok && validName(outcome) == nil {
					jobs(outcome).add(attempt, v)
				}
			case validName(label) != nil:
			case kind == "attempts":
				attempts[label] = v
			case kind == "retries":
				retries[label] = v
			case kind == "dead_letters":
				deadLetters[label] = v
			case kind == "deferred":
				deferrals[label] = v
			case kind == "finished_sum":
				jobs(label).sum = v
			}
		}
		for i, c := range plainCounters {
			s.counter(c.desc, plain[i], q.Name)
		}
		for _, o := range outcomes {
			attempts[o] += 0
		}
		for _, m := range []struct {
			d      *desc
			values map[string]float64
			always []string
		}{{attemptsDesc, attempts, outcomes}, {retriesDesc, retries, nil}, {deadLettersDesc, deadLetters, nil}, {deferralsDesc, deferrals, nil}} {
			for _, label := range bounded(s, m.values, m.always) {
				s.counter(m.d, m.values[label], q.Name, label)
			}
		}
		for _, o := range bounded(s, finished, outcomes) {
			f := finished[o]
			for i := 1; i < len(f.per); i++ {
				f.per[i] += f.per[i-1] // now cumulative
			}
			s.histogram(jobAttemptsDesc, attemptBuckets, f.per[:len(attemptBuckets)], f.per[len(attemptBuckets)], f.sum, q.Name, o)
		}
	}
}

// bounded returns at most maxStatsLabels keys of m: those of always that
// m has, then the others, sorted. When it leaves some out it says so in s.
func bounded[V any](s *sink, m map[string]V, always []string) []string {
	if len(m) <= maxStatsLabels {
		return slices.Sorted(maps.Keys(m))
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
