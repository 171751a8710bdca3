package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// statsRows turns a queue's stats hash ({Q}:stats, see
// queue/redisqueue/README.md, "Counters") into the rows queue stats prints:
// a label and its figures in words, grouped (attempts by outcome, retries,
// deferrals and dead letters by reason, the mean attempt jobs finished on,
// the moves), instead of raw fields such as finished_sum:dead_letter. The
// per-type fields (t:…, types…) are left to the job types table; a field
// it does not know is printed as it is, last.
func statsRows(c map[string]int64) [][2]string {
	used := map[string]bool{}
	get := func(k string) int64 { used[k] = true; return c[k] }
	var rows [][2]string
	add := func(label string, parts []string) {
		if len(parts) > 0 {
			rows = append(rows, [2]string{label, strings.Join(parts, ", ")})
		}
	}
	add("enqueued", []string{strconv.FormatInt(get("enqueued"), 10)})
	var attempts []string
	for _, o := range []string{"success", "retry", "deferred", "dead_letter"} {
		attempts = append(attempts, fmt.Sprintf("%s %d", strings.ReplaceAll(o, "_", " "), get("attempts:"+o)))
	}
	add("attempts", attempts)
	byReason := func(prefix string) []string {
		var parts []string
		for _, k := range sortedKeys(c) {
			if r, ok := strings.CutPrefix(k, prefix); ok {
				parts = append(parts, fmt.Sprintf("%s %d", r, get(k)))
			}
		}
		return parts
	}
	add("retries by reason", byReason("retries:"))
	add("deferrals by reason", byReason("deferred:"))
	add("dead letters by reason", byReason("dead_letters:"))
	get("max_attempts_reached") // the same as dead_letters:max_attempts_reached
	for _, o := range [][2]string{{"success", "jobs that succeeded"}, {"dead_letter", "jobs dead-lettered"}} {
		var jobs int64
		for _, k := range sortedKeys(c) {
			if strings.HasPrefix(k, "finished:"+o[0]+":") {
				jobs += get(k)
			}
		}
		if sum := get("finished_sum:" + o[0]); jobs > 0 {
			add(o[1], []string{fmt.Sprintf("%d, on attempt %.2f on average", jobs, float64(sum)/float64(jobs))})
		}
	}
	var moves []string
	for _, m := range [][2]string{{"promoted", "promoted when due"}, {"force_run", "run early"}, {"reclaimed", "reclaimed"},
		{"reclaim_skipped", "reclaims skipped"}, {"replayed", "replayed"}, {"discarded", "discarded"}} {
		if n := get(m[0]); n > 0 {
			moves = append(moves, fmt.Sprintf("%s %d", m[1], n))
		}
	}
	add("moves", moves)
	for _, k := range sortedKeys(c) {
		if !used[k] && !strings.HasPrefix(k, "t:") && !strings.HasPrefix(k, "types") {
			rows = append(rows, [2]string{k, strconv.FormatInt(c[k], 10)})
		}
	}
	return rows
}

func sortedKeys(m map[string]int64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
