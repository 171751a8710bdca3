package redisqueue

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// buildCases lists the shared queue cases (their inputs; the expected
// states come from running them, see TestQueueCases). Offsets from "now"
// stay whole seconds or more apart, so normalising is never ambiguous.

// pendingJob is a stream entry delivered once to consumer c1.
func pendingJob(id string, fields ...string) caseEntry {
	return caseEntry{ID: id, Fields: fields, Pend: &casePending{Consumer: "c1", Deliveries: 1}}
}

func job(jobID string, attempt int, extra ...string) []string {
	return append(strs("id", jobID, "attempt", strconv.Itoa(attempt), "first_enqueued_ms", "{now-60000}", "payload", "p-"+jobID), extra...)
}

func handle(err *caseError) caseEvent { return caseEvent{Type: "handle", Entry: "1-1", Error: err} }

func httpErr(status int, retryAfter string) *caseError {
	return &caseError{Message: fmt.Sprintf("http %d", status), HTTPStatus: status, RetryAfter: retryAfter}
}

func buildCases() []queueCase {
	var cs []queueCase
	add := func(name string, st caseState, ev caseEvent) {
		cs = append(cs, queueCase{Name: name, State: st, Event: ev})
	}
	plainCases(add)
	one := func(attempt int, extra ...string) caseState {
		return caseState{Jobs: []caseEntry{pendingJob("1-1", job("j1", attempt, extra...)...)}}
	}

	// A job succeeds: on its first attempt, on a later one, onto counters
	// that exist, beside other entries.
	for _, a := range []int{1, 2, 4, 64, 65, 1000000} {
		add(fmt.Sprintf("success/attempt-%d", a), one(a), handle(nil))
	}
	st := one(3)
	st.Stats = map[string]string{"attempts:success": "7", "finished:success:3": "2", "finished_sum:success": "40", "enqueued": "9"}
	add("success/onto-counters", st, handle(nil))
	st = one(1)
	st.Jobs = append(st.Jobs, pendingJob("1-2", job("j2", 1)...), caseEntry{ID: "1-3", Fields: job("j3", 1)})
	add("success/beside-others", st, handle(nil))

	// Fails with an HTTP status, at attempts 1, 2 (uncertain limit), 4 (max).
	for _, status := range []int{400, 401, 403, 404, 408, 409, 422, 429, 500, 501, 502, 503, 504} {
		for _, a := range []int{1, 2, 4} {
			add(fmt.Sprintf("http/%d/attempt-%d", status, a), one(a), handle(httpErr(status, "")))
		}
	}
	// Retry-After: delta seconds, zero, past the cap (give_up), garbage,
	// negative, absurd, with a 503 and a 429, and at the last attempt.
	for _, status := range []int{429, 503} {
		for _, ra := range []string{"0", "7", "30", "31", "garbage", "-1", "9999999999", "1.5"} {
			add(fmt.Sprintf("retry-after/%d/%s", status, ra), one(1), handle(httpErr(status, ra)))
		}
	}
	add("retry-after/last-attempt", one(4), handle(httpErr(503, "7")))
	// gRPC codes 1..16 at attempt 1, and the retryable ones at the last.
	for code := 1; code <= 16; code++ {
		add(fmt.Sprintf("grpc/%d/attempt-1", code), one(1), handle(&caseError{Message: fmt.Sprintf("grpc %d", code), GRPCCode: code}))
	}
	for _, code := range []int{4, 8, 10, 14} {
		add(fmt.Sprintf("grpc/%d/attempt-4", code), one(4), handle(&caseError{Message: fmt.Sprintf("grpc %d", code), GRPCCode: code}))
	}
	// Error kinds, known and unknown, at attempts 1 and 4.
	for _, kind := range []string{"timeout", "connect_timeout", "connection_refused", "connection_reset", "dns_temporary",
		"dns_not_found", "deadlock", "lock_timeout", "invalid_input", "parse_error", "schema_mismatch", "no_such_kind"} {
		for _, a := range []int{1, 4} {
			add(fmt.Sprintf("kind/%s/attempt-%d", kind, a), one(a), handle(&caseError{Message: kind, ErrorKind: kind}))
		}
	}
	add("kind/none", one(1), handle(&caseError{Message: "something broke"}))
	// A classifier that names the method: a queue job is not gated.
	add("method/POST-503", one(1), handle(&caseError{Message: "http 503", HTTPStatus: 503, Method: "POST"}))
	add("method/POST-connection-reset", one(1), handle(&caseError{Message: "reset", ErrorKind: "connection_reset", Method: "POST"}))
	// Each language's own error of a kind, classified by errorkinds.json.
	for _, kind := range []string{"connection_refused", "connection_reset", "connect_timeout", "timeout", "dns_temporary", "dns_not_found"} {
		for _, a := range []int{1, 4} {
			add(fmt.Sprintf("native/%s/attempt-%d", kind, a), one(a), handle(&caseError{Message: "native " + kind, Native: kind}))
		}
	}
	// The handler's own retry loop gave up (retry at one layer,
	// docs/layers.md): dead-lettered as retried_downstream, not retried
	// again; a permanent failure stays permanent; a breaker's refusal (no
	// call made) is decided by what it says.
	inner := func(reason string, e caseError) *caseError { e.InnerRetry = reason; return &e }
	for _, a := range []int{1, 3} {
		add(fmt.Sprintf("inner-retry/max_attempts_reached/http-503/attempt-%d", a), one(a), handle(inner("max_attempts_reached", *httpErr(503, ""))))
	}
	add("inner-retry/max_attempts_reached/native-connection_refused", one(1),
		handle(inner("max_attempts_reached", caseError{Message: "refused after 3 attempts", Native: "connection_refused"})))
	add("inner-retry/max_elapsed_exceeded/timeout", one(1), handle(inner("max_elapsed_exceeded", caseError{Message: "deadline", ErrorKind: "timeout"})))
	add("inner-retry/retry_after_too_long/http-429", one(1), handle(inner("retry_after_too_long", *httpErr(429, "120"))))
	add("inner-retry/permanent_error/http-400", one(1), handle(inner("permanent_error", *httpErr(400, ""))))
	add("inner-retry/circuit_open", one(1), handle(inner("circuit_open", caseError{Message: "inner breaker open"})))
	add("inner-retry/circuit_open/http-503", one(1), handle(inner("circuit_open", *httpErr(503, ""))))
	// A status, a code and a kind at once.
	add("mixed/status-and-kind", one(1), handle(&caseError{Message: "both", HTTPStatus: 400, ErrorKind: "timeout"}))
	// Time budget: first enqueued long ago, or a retry that would land past it.
	for _, ago := range []int{3599500, 3600000, 7200000} {
		st := one(2)
		st.Jobs[0].Fields[5] = fmt.Sprintf("{now-%d}", ago)
		add(fmt.Sprintf("elapsed/%dms-ago", ago), st, handle(httpErr(503, "")))
	}
	// The decorrelated strategy's previous delay travels with the entry; a
	// retry keeps the payload, the last error and reason are replaced.
	add("retry/prev-delay", one(2, "prev_delay_ms", "4000"), handle(httpErr(503, "")))
	add("retry/last-error-replaced", one(2, "last_error", "old", "last_reason", "transient"), handle(httpErr(503, "")))
	add("retry/odd-payload", caseState{Jobs: []caseEntry{pendingJob("1-1", "id", "j1", "attempt", "1", "first_enqueued_ms", "{now-1000}",
		"payload", "{\"a\":[1,2]} \u00e9 \\n")}}, handle(httpErr(503, "")))
	add("retry/message-with-newlines", one(1), handle(&caseError{Message: "line one\nline two\ttab", HTTPStatus: 503}))
	add("retry/onto-counters", caseState{Jobs: one(1).Jobs, Stats: map[string]string{"attempts:retry": "5", "retries:transient": "5"}}, handle(httpErr(503, "")))
	add("dead-letter/onto-counters", caseState{Jobs: one(4).Jobs, Stats: map[string]string{"attempts:dead_letter": "1", "max_attempts_reached": "1",
		"dead_letters:max_attempts_reached": "1", "finished:dead_letter:4": "1", "finished_sum:dead_letter": "4"}}, handle(httpErr(503, "")))

	// Deferred: the policy refused the job (an open breaker, an empty
	// budget); it goes back to the delayed set, its attempt unchanged, even
	// at the last attempt, and is never dead-lettered for it.
	deferEv := func(reason string, delayMs int64, lastErr string) caseEvent {
		return caseEvent{Type: "defer", Entry: "1-1", Reason: reason, DelayMs: delayMs, LastError: lastErr}
	}
	for _, a := range []int{1, 4} {
		add(fmt.Sprintf("defer/circuit_open/attempt-%d", a), one(a), deferEv("circuit_open", 30000, ""))
		add(fmt.Sprintf("defer/budget_exhausted/attempt-%d", a), one(a), deferEv("budget_exhausted", 2000, "http 503"))
	}
	add("defer/delay-0", one(2), deferEv("circuit_open", 0, ""))
	add("defer/keeps-prev-delay-and-error", one(3, "prev_delay_ms", "4000", "last_error", "old", "last_reason", "transient"), deferEv("circuit_open", 5000, ""))
	add("defer/replaces-error", one(3, "last_error", "old", "last_reason", "transient"), deferEv("budget_exhausted", 5000, "http 503"))
	add("defer/onto-counters", caseState{Jobs: one(1).Jobs, Stats: map[string]string{"attempts:deferred": "3", "deferred:circuit_open": "3", "attempts:retry": "2"}},
		deferEv("circuit_open", 30000, ""))
	st = one(1)
	st.Jobs[0].Pend = nil
	add("defer/not-pending", st, deferEv("circuit_open", 30000, ""))
	st = one(1)
	st.Jobs[0].Pend.Consumer = "other"
	add("defer/pending-elsewhere", st, deferEv("circuit_open", 30000, ""))
	add("defer/malformed-entry", caseState{Jobs: []caseEntry{pendingJob("1-1", strs("id", "j1", "attempt", "0x10", "first_enqueued_ms", "{now-1000}")...)}},
		deferEv("circuit_open", 30000, ""))
	for _, bad := range []string{"transient", "max_attempts_reached", ""} {
		add("defer/bad-reason-"+bad, one(1), deferEv(bad, 30000, ""))
	}
	for name, raw := range map[string][][]string{
		"stats-a-string":   {{"SET", "{q}:stats", "x"}},
		"delayed-a-string": {{"SET", "{q}:delayed", "x"}},
		"counter-not-int":  {{"HSET", "{q}:stats", "deferred:circuit_open", "1.5"}},
		"counter-at-max":   {{"HSET", "{q}:stats", "attempts:deferred", "9223372036854775807"}},
		"member-exists":    {{"ZADD", "{q}:delayed", "5", `{"last_reason":"circuit_open","prev_delay_ms":0,"last_error":"","payload":"p-j1","id":"j1","source":"1-1","attempt":1,"first_enqueued_ms":"{now-60000}"}`}},
	} {
		add("defer/damaged/"+name, caseState{Jobs: one(1).Jobs, Raw: raw}, deferEv("circuit_open", 30000, ""))
	}

	// Not pending: another worker moved it first; each outcome applies nothing.
	for _, ev := range []struct {
		name string
		err  *caseError
	}{{"ack", nil}, {"retry", httpErr(503, "")}, {"dead-letter", httpErr(400, "")}} {
		st := one(1)
		st.Jobs[0].Pend = nil
		add("not-pending/"+ev.name, st, handle(ev.err))
		st = one(1)
		st.Jobs[0].Pend.Consumer = "other"
		add("pending-elsewhere/"+ev.name, st, handle(ev.err))
	}

	// Malformed entries: dead-lettered as malformed whatever the handler
	// said, every field kept.
	malformed := map[string][]string{
		"no-id":             strs("attempt", "1", "first_enqueued_ms", "{now-1000}", "payload", "p"),
		"empty-id":          strs("id", "", "attempt", "1", "first_enqueued_ms", "{now-1000}"),
		"no-attempt":        strs("id", "j1", "first_enqueued_ms", "{now-1000}"),
		"attempt-0":         strs("id", "j1", "attempt", "0", "first_enqueued_ms", "{now-1000}"),
		"attempt-01":        strs("id", "j1", "attempt", "01", "first_enqueued_ms", "{now-1000}"),
		"attempt-negative":  strs("id", "j1", "attempt", "-1", "first_enqueued_ms", "{now-1000}"),
		"attempt-hex":       strs("id", "j1", "attempt", "0x10", "first_enqueued_ms", "{now-1000}"),
		"attempt-exponent":  strs("id", "j1", "attempt", "1e3", "first_enqueued_ms", "{now-1000}"),
		"attempt-space":     strs("id", "j1", "attempt", " 5", "first_enqueued_ms", "{now-1000}"),
		"attempt-1e14":      strs("id", "j1", "attempt", "100000000000000", "first_enqueued_ms", "{now-1000}"),
		"attempt-word":      strs("id", "j1", "attempt", "two", "first_enqueued_ms", "{now-1000}"),
		"no-first-enqueued": strs("id", "j1", "attempt", "1"),
		"first-enqueued-x":  strs("id", "j1", "attempt", "1", "first_enqueued_ms", "yesterday"),
		"extra-fields":      strs("attempt", "x", "colour", "blue", "id", "j1", "attempt", "y"),
		"only-delayed-flag": strs("malformed_delayed_member", "not json", "payload", "p"),
		"only-attempt":      strs("attempt", "1", "payload", "p"),
		"only-first":        strs("first_enqueued_ms", "{now-1000}", "payload", "p"),
	}
	for name, fields := range malformed {
		for _, ev := range []struct {
			name string
			err  *caseError
		}{{"success", nil}, {"503", httpErr(503, "")}} {
			add(fmt.Sprintf("malformed-entry/%s/%s", name, ev.name),
				caseState{Jobs: []caseEntry{pendingJob("1-1", fields...)}}, handle(ev.err))
		}
	}
	wide := job("j1", 1)
	for i := 0; i < 1001; i++ {
		wide = append(wide, fmt.Sprintf("f%04d", i), strconv.Itoa(i))
	}
	add("malformed-entry/wide-1001-fields", caseState{Jobs: []caseEntry{pendingJob("1-1", append(wide[2:len(wide):len(wide)], "id", "")...)}}, handle(nil))
	add("dead-letter/wide-1001-fields", caseState{Jobs: []caseEntry{pendingJob("1-1", wide...)}}, handle(httpErr(400, "")))

	// Damage: the script refuses and the state is as it was.
	damage := map[string][][]string{
		"stats-a-string":   {{"SET", "{q}:stats", "x"}},
		"delayed-a-string": {{"SET", "{q}:delayed", "x"}},
		"dlq-a-hash":       {{"HSET", "{q}:dlq", "a", "b"}},
		"counter-not-int":  {{"HSET", "{q}:stats", "attempts:success", "abc", "attempts:retry", "1.5", "attempts:dead_letter", "0x1"}},
		"counter-at-max":   {{"HSET", "{q}:stats", "attempts:success", "9223372036854775807", "attempts:retry", "9223372036854775807", "attempts:dead_letter", "9223372036854775807"}},
		"counter-spaces":   {{"HSET", "{q}:stats", "attempts:success", " 1", "attempts:retry", "01", "attempts:dead_letter", "-0"}},
		"dlq-at-max-id":    {{"XADD", "{q}:dlq", "18446744073709551615-18446744073709551615", "f", "v"}},
		"member-exists":    {{"ZADD", "{q}:delayed", "5", `{"last_reason":"transient","prev_delay_ms":1000,"last_error":"http 503","payload":"p-j1","id":"j1","source":"1-1","attempt":2,"first_enqueued_ms":"{now-60000}"}`}},
	}
	for name, raw := range damage {
		for _, ev := range []struct {
			name string
			err  *caseError
		}{{"ack", nil}, {"retry", httpErr(503, "")}, {"dead-letter", httpErr(400, "")}} {
			if name == "member-exists" && ev.name == "retry" {
				// The member holds the error's text, which each language
				// writes its own way: scripts_test.go covers this refusal.
				continue
			}
			add(fmt.Sprintf("damaged/%s/%s", name, ev.name), caseState{Jobs: one(1).Jobs, Raw: raw}, handle(ev.err))
		}
	}

	// Promote at a given server time: due and future members, limits.
	retryMember := func(id string, attempt int) string {
		return fmt.Sprintf(`{"id":"%s","attempt":%d,"first_enqueued_ms":{now-60000},"payload":"p-%s","last_error":"http 503","last_reason":"transient","source":"1-1","prev_delay_ms":1000}`, id, attempt, id)
	}
	mixed := []caseMember{
		{retryMember("a", 2), "{now-3000}"}, {retryMember("b", 3), "{now-2000}"},
		{retryMember("c", 2), "{now+5000}"}, {retryMember("d", 2), "{now+9000}"},
	}
	for _, limit := range []int{1, 2, 3, 10, 10000} {
		add(fmt.Sprintf("promote/limit-%d", limit), caseState{Delayed: mixed}, caseEvent{Type: "promote", Limit: limit})
	}
	add("promote/deferred-member", caseState{Delayed: []caseMember{{`{"id":"a","attempt":3,"first_enqueued_ms":{now-60000},"payload":"p-a","last_error":"http 503","last_reason":"circuit_open","source":"1-1","prev_delay_ms":4000}`, "{now-1000}"}}},
		caseEvent{Type: "promote", Limit: 10})
	add("promote/none-due", caseState{Delayed: mixed[2:]}, caseEvent{Type: "promote", Limit: 10})
	add("promote/empty", caseState{}, caseEvent{Type: "promote", Limit: 10})
	add("promote/onto-counter", caseState{Delayed: mixed, Stats: map[string]string{"promoted": "41"}}, caseEvent{Type: "promote", Limit: 10})
	add("promote/minimal-member", caseState{Delayed: []caseMember{{`{"id":"m","attempt":2}`, "{now-1000}"}}}, caseEvent{Type: "promote", Limit: 10})
	add("promote/escapes", caseState{Delayed: []caseMember{{`{"id":"m\"q","attempt":2,"payload":"a\\u00e9\n"}`, "{now-1000}"}}}, caseEvent{Type: "promote", Limit: 10})
	for name, m := range map[string]string{
		"not-json": "not json", "array": "[1,2]", "null": "null", "true": "true", "nested": `{"id":"m","attempt":2,"payload":{"a":1}}`,
		"float": `{"id":"m","attempt":2.5}`, "exponent": `{"id":"m","attempt":1e300}`, "twenty-digits": `{"id":"m","attempt":12345678901234567890}`,
		"negative": `{"id":"m","attempt":-2}`, "leading-zero": `{"id":"m","attempt":02}`, "twice": `{"id":"m","id":"n","attempt":2}`,
		"unknown-field": `{"id":"m","attempt":2,"colour":"blue"}`, "attempt-string": `{"id":"m","attempt":"2"}`, "empty": "",
		"empty-object": "{}", "bytes": "\xff\xfe{", "id-number": `{"id":5,"attempt":2}`,
	} {
		add("promote/malformed-member/"+name, caseState{Delayed: []caseMember{{m, "{now-1000}"}, {retryMember("ok", 2), "{now-500}"}}},
			caseEvent{Type: "promote", Limit: 10})
	}
	for _, limit := range []int{0, -1, 10001} {
		add(fmt.Sprintf("promote/bad-limit-%d", limit), caseState{Delayed: mixed}, caseEvent{Type: "promote", Limit: limit})
	}
	add("promote/jobs-a-string", caseState{Delayed: mixed, Raw: [][]string{{"DEL", "{q}:jobs"}, {"SET", "{q}:jobs", "x"}}}, caseEvent{Type: "promote", Limit: 10})
	add("promote/delayed-a-string", caseState{Raw: [][]string{{"SET", "{q}:delayed", "x"}}}, caseEvent{Type: "promote", Limit: 10})
	add("promote/counter-not-int", caseState{Delayed: mixed, Stats: map[string]string{"promoted": "many"}}, caseEvent{Type: "promote", Limit: 10})
	add("promote/counter-at-max", caseState{Delayed: mixed, Stats: map[string]string{"promoted": "9223372036854775806"}}, caseEvent{Type: "promote", Limit: 10})
	add("promote/jobs-at-max-id", caseState{Delayed: mixed, Raw: [][]string{{"XADD", "{q}:jobs", "18446744073709551615-18446744073709551615", "f", "v"}}},
		caseEvent{Type: "promote", Limit: 10})

	// Run delayed jobs now (force run), by job id or by due time.
	for _, id := range []string{"a", "c", "d", "zz", ""} {
		add("run/id-"+id, caseState{Delayed: mixed}, caseEvent{Type: "run", JobID: id})
	}
	for _, b := range []struct {
		before string
		limit  int
	}{{"{now+6000}", 1}, {"{now+6000}", 2}, {"{now+6000}", 10}, {"{now-10000}", 10}, {"{now+60000}", 10000}, {"{now+6000}", 0}, {"{now+6000}", 10001}} {
		add(fmt.Sprintf("run/before-%s/limit-%d", b.before, b.limit), caseState{Delayed: mixed}, caseEvent{Type: "run", Before: b.before, Limit: b.limit})
	}
	add("run/malformed-member", caseState{Delayed: []caseMember{{"not json", "{now+5000}"}, {`{"id":"c","attempt":2.5}`, "{now+6000}"}}},
		caseEvent{Type: "run", Before: "{now+60000}", Limit: 10})
	add("run/onto-counter", caseState{Delayed: mixed, Stats: map[string]string{"force_run": "2"}}, caseEvent{Type: "run", JobID: "c"})
	add("run/counter-not-int", caseState{Delayed: mixed, Stats: map[string]string{"force_run": "x"}}, caseEvent{Type: "run", JobID: "c"})
	add("run/jobs-a-string", caseState{Delayed: mixed, Raw: [][]string{{"DEL", "{q}:jobs"}, {"SET", "{q}:jobs", "x"}}}, caseEvent{Type: "run", JobID: "c"})

	// A worker dies: its entries are reclaimed (then run), or dead-lettered
	// as crash_loop at the delivery limit.
	idle := func(id string, deliveries int, idleMs int64, fields ...string) caseEntry {
		return caseEntry{ID: id, Fields: fields, Pend: &casePending{Consumer: "dead", Deliveries: deliveries, IdleMs: idleMs}}
	}
	crashed := []caseEntry{
		idle("1-1", 1, 120000, job("j1", 1)...), idle("1-2", 2, 120000, job("j2", 2)...),
		idle("1-3", 5, 120000, job("j3", 1)...), idle("1-4", 1, 1000, job("j4", 1)...),
	}
	reclaim := func(err *caseError, count, maxDel int) caseEvent {
		return caseEvent{Type: "reclaim", Error: err, MinIdleMs: 60000, Count: count, MaxDeliveries: maxDel}
	}
	for _, ev := range []struct {
		name string
		err  *caseError
	}{{"success", nil}, {"503", httpErr(503, "")}, {"400", httpErr(400, "")}} {
		add("reclaim/"+ev.name, caseState{Jobs: crashed}, reclaim(ev.err, 10, 5))
		add("reclaim/count-1/"+ev.name, caseState{Jobs: crashed}, reclaim(ev.err, 1, 5))
		add("reclaim/max-deliveries-2/"+ev.name, caseState{Jobs: crashed}, reclaim(ev.err, 10, 2))
	}
	add("reclaim/nothing-idle", caseState{Jobs: crashed[3:]}, reclaim(nil, 10, 5))
	add("reclaim/data-deleted", caseState{Jobs: crashed, Raw: [][]string{{"XDEL", "{q}:jobs", "1-1", "1-3"}}}, reclaim(nil, 10, 5))
	add("reclaim/malformed-crash-loop", caseState{Jobs: []caseEntry{idle("1-1", 5, 120000, "payload", "x", "attempt", "zz")}}, reclaim(nil, 10, 5))
	add("reclaim/malformed-claimed", caseState{Jobs: []caseEntry{idle("1-1", 1, 120000, "payload", "x", "id", "")}}, reclaim(nil, 10, 5))
	add("reclaim/dlq-a-string", caseState{Jobs: crashed, Raw: [][]string{{"SET", "{q}:dlq", "x"}}}, reclaim(nil, 10, 5))
	add("reclaim/dlq-at-max-id", caseState{Jobs: crashed, Raw: [][]string{{"XADD", "{q}:dlq", "18446744073709551615-18446744073709551615", "f", "v"}}}, reclaim(nil, 10, 5))
	add("reclaim/counter-not-int", caseState{Jobs: crashed, Stats: map[string]string{"reclaimed": "x"}}, reclaim(nil, 10, 5))
	add("reclaim/stats-a-string", caseState{Jobs: crashed, Raw: [][]string{{"SET", "{q}:stats", "x"}}}, reclaim(nil, 10, 5))
	for _, bad := range []struct {
		name          string
		count, maxDel int
		minIdle       int64
	}{{"count-0", 0, 5, 60000}, {"count-1001", 1001, 5, 60000}, {"max-deliveries-0", 10, 0, 60000}, {"min-idle-negative", 10, 5, -1}} {
		add("reclaim/bad-"+bad.name, caseState{Jobs: crashed}, caseEvent{Type: "reclaim", MinIdleMs: bad.minIdle, Count: bad.count, MaxDeliveries: bad.maxDel})
	}

	// Replay with a limit and a reason.
	dead := func(id, jobID, reason string) caseEntry {
		return caseEntry{ID: id, Fields: strs("reason", reason, "error", "boom", "attempt", "3", "id", jobID, "source_id", "1-9",
			"first_enqueued_ms", "{now-60000}", "payload", "p-"+jobID, "dead_lettered_ms", "{now-1000}")}
	}
	dlq := []caseEntry{dead("1-1", "a", "max_attempts_reached"), dead("1-2", "b", "permanent_error"),
		dead("1-3", "c", "max_attempts_reached"), {ID: "1-4", Fields: strs("reason", "malformed", "error", "no id", "entry.payload", "x")},
		dead("1-5", "e", "crash_loop")}
	for _, limit := range []int{1, 2, 5, 100} {
		for _, reason := range []string{"", "max_attempts_reached", "crash_loop", "malformed", "no_such_reason"} {
			add(fmt.Sprintf("replay/limit-%d/reason-%s", limit, reason), caseState{DLQ: dlq}, caseEvent{Type: "replay", Limit: limit, Reason: reason})
		}
	}
	add("replay/empty", caseState{}, caseEvent{Type: "replay", Limit: 10})
	add("replay/onto-counter", caseState{DLQ: dlq, Stats: map[string]string{"replayed": "3"}}, caseEvent{Type: "replay", Limit: 10})
	for _, bad := range []struct {
		name   string
		limit  int
		reason string
	}{{"limit-0", 0, ""}, {"reason-space", 10, "max attempts"}, {"reason-long", 10, strings.Repeat("r", 129)}, {"reason-control", 10, "a\tb"}} {
		add("replay/bad-"+bad.name, caseState{DLQ: dlq}, caseEvent{Type: "replay", Limit: bad.limit, Reason: bad.reason})
	}
	add("replay/jobs-a-string", caseState{DLQ: dlq, Raw: [][]string{{"DEL", "{q}:jobs"}, {"SET", "{q}:jobs", "x"}}}, caseEvent{Type: "replay", Limit: 10})
	add("replay/counter-not-int", caseState{DLQ: dlq, Stats: map[string]string{"replayed": "1e3"}}, caseEvent{Type: "replay", Limit: 10})
	add("replay/jobs-at-max-id", caseState{DLQ: dlq, Raw: [][]string{{"XADD", "{q}:jobs", "18446744073709551615-18446744073709551615", "f", "v"}}},
		caseEvent{Type: "replay", Limit: 10})
	// The handler overran the worker's deadline: the worker's own deadline
	// error, a timeout, decided as any failure.
	deadline := caseEvent{Type: "handle", Entry: "1-1", Deadline: true}
	for _, a := range []int{1, 2, 4} {
		add(fmt.Sprintf("deadline/attempt-%d", a), one(a), deadline)
	}
	add("deadline/typed", one(1, "type", "send_email"), deadline)

	// Hold: a worker keeps its entries from reclaim while it runs them.
	holds := []caseEntry{pendingJob("1-1", job("j1", 1)...),
		{ID: "1-2", Fields: job("j2", 1), Pend: &casePending{Consumer: "other", Deliveries: 3, IdleMs: 120000}},
		{ID: "1-3", Fields: job("j3", 1)}}
	hold := func(ids ...string) caseEvent { return caseEvent{Type: "hold", Consumer: "c1", Entries: ids} }
	add("hold/own", caseState{Jobs: holds}, hold("1-1"))
	add("hold/another-consumer", caseState{Jobs: holds}, hold("1-2"))
	add("hold/not-pending", caseState{Jobs: holds}, hold("1-3"))
	add("hold/missing", caseState{Jobs: holds}, hold("9-9"))
	add("hold/mixed", caseState{Jobs: holds}, hold("1-1", "1-2", "1-3", "9-9"))
	add("hold/data-deleted", caseState{Jobs: holds, Raw: [][]string{{"XDEL", "{q}:jobs", "1-1"}}}, hold("1-1"))
	add("hold/bad-id", caseState{Jobs: holds}, hold("abc"))
	many := make([]string, 1001)
	for i := range many {
		many[i] = fmt.Sprintf("1-%d", i+1)
	}
	add("hold/too-many", caseState{Jobs: holds}, hold(many...))
	add("hold/jobs-a-string", caseState{Raw: [][]string{{"SET", "{q}:jobs", "x"}}}, hold("1-1"))
	typedCases(add)
	// Maps above list in random order: the file lists by name.
	sort.SliceStable(cs, func(i, j int) bool { return cs[i].Name < cs[j].Name })
	return cs
}

// typedCases are the job types' cases (queue/redisqueue/README.md, "Job types"):
// typed and untyped jobs through every move, the registry of types counted
// by name and its "other" overflow, types that are not valid in an entry
// (counted as "other", kept byte for byte), and enqueue refusing them.
func typedCases(add func(string, caseState, caseEvent)) {
	typed := func(t string, attempt int, extra ...string) caseState {
		return caseState{Jobs: []caseEntry{pendingJob("1-1", job("j1", attempt, append(strs("type", t), extra...)...)...)}}
	}
	onto := func(st caseState, stats ...string) caseState {
		st.Stats = map[string]string{}
		for i := 0; i+1 < len(stats); i += 2 {
			st.Stats[stats[i]] = stats[i+1]
		}
		return st
	}
	outcomes := []struct {
		name    string
		attempt int
		err     *caseError
	}{{"success", 1, nil}, {"retry", 1, httpErr(503, "")}, {"dead-letter", 2, httpErr(400, "")}, {"max-attempts", 4, httpErr(503, "")}}
	for _, o := range outcomes {
		add("typed/new/"+o.name, typed("send_email", o.attempt), handle(o.err))
		add("typed/known/"+o.name, onto(typed("send_email", o.attempt), "types", "2", "types:known:send_email", "1", "types:known:charge_card", "1",
			"t:send_email:attempts:success", "4", "attempts:success", "9"), handle(o.err))
		// At the limit: a new type is counted as other, and in types:overflow.
		add("typed/overflow/"+o.name, onto(typed("render_report", o.attempt), "types", "2", "types:limit", "2",
			"types:known:send_email", "1", "types:known:charge_card", "1", "types:overflow", "3"), handle(o.err))
		add("typed/known-at-limit/"+o.name, onto(typed("charge_card", o.attempt), "types", "2", "types:limit", "2",
			"types:known:send_email", "1", "types:known:charge_card", "1"), handle(o.err))
		// Types that are not valid, written by someone else: the job runs,
		// counted as other, its type kept byte for byte.
		for name, t := range map[string]string{"empty": "", "too-long": strings.Repeat("t", 65), "binary": "bin\x00\x01\x7f", "colon": "a:b", "space": "send email"} {
			add("typed/malformed-type/"+name+"/"+o.name, typed(t, o.attempt), handle(o.err))
		}
		add("typed/named-other/"+o.name, typed("other", o.attempt), handle(o.err))
	}
	add("typed/longest", typed(strings.Repeat("t", 64), 1), handle(nil))
	add("typed/charset", typed("a-Z_0.9/x", 1), handle(nil))
	add("typed/type-twice", caseState{Jobs: []caseEntry{pendingJob("1-1", job("j1", 1, "type", "first", "type", "second")...)}}, handle(httpErr(400, "")))
	add("typed/default-limit-50", onto(typed("new_one", 1), "types", "50"), handle(nil))
	add("typed/default-limit-49", onto(typed("new_one", 1), "types", "49"), handle(nil))
	add("typed/limit-not-int", onto(typed("new_one", 1), "types", "50", "types:limit", "x"), handle(nil))
	add("typed/limit-zero", onto(typed("new_one", 1), "types", "3", "types:limit", "0"), handle(nil))
	add("typed/limit-lowered", onto(typed("send_email", 1), "types", "5", "types:limit", "2", "types:known:send_email", "1"), handle(nil))
	// Damaged registry or per-type counters: refused, nothing written.
	for name, stats := range map[string][]string{
		"types-not-int":        {"types", "many"},
		"types-at-max":         {"types", "9223372036854775807"},
		"known-not-int":        {"t:send_email:attempts:success", "1.5", "types:known:send_email", "1", "types", "1"},
		"typed-counter-at-max": {"t:send_email:attempts:dead_letter", "9223372036854775807", "t:send_email:attempts:success", "9223372036854775807", "t:send_email:attempts:retry", "9223372036854775807", "types:known:send_email", "1"},
		"overflow-at-max":      {"types", "50", "types:overflow", "9223372036854775807"},
	} {
		for _, o := range outcomes[:3] {
			add("typed/damaged/"+name+"/"+o.name, onto(typed("send_email", o.attempt), stats...), handle(o.err))
		}
	}
	add("typed/damaged/known-twice-registered-garbage", onto(typed("send_email", 1), "types:known:send_email", "yes"), handle(nil))
	add("typed/stats-a-string", caseState{Jobs: typed("send_email", 1).Jobs, Raw: [][]string{{"SET", "{q}:stats", "x"}}}, handle(nil))
	add("typed/defer", typed("charge_card", 2), caseEvent{Type: "defer", Entry: "1-1", Reason: "circuit_open", DelayMs: 30000})
	add("typed/defer-overflow", onto(typed("charge_card", 2), "types", "1", "types:limit", "1", "types:known:x", "1"),
		caseEvent{Type: "defer", Entry: "1-1", Reason: "budget_exhausted", DelayMs: 5000})
	add("typed/defer-malformed-type", typed("", 2), caseEvent{Type: "defer", Entry: "1-1", Reason: "circuit_open", DelayMs: 30000})

	// The type travels with the delayed member, through promote and run.
	member := func(id, extra string) string {
		return fmt.Sprintf(`{"id":"%s","attempt":2,"first_enqueued_ms":{now-60000},"payload":"p-%s","last_error":"http 503","last_reason":"transient","source":"1-1","prev_delay_ms":1000%s}`, id, id, extra)
	}
	for name, extra := range map[string]string{"typed": `,"type":"send_email"`, "empty-type": `,"type":""`, "binary-type": `,"type":"b\u0000\u00e9"`,
		"type-number": `,"type":5`, "type-null": `,"type":null`, "type-twice": `,"type":"a","type":"b"`} {
		add("typed/promote/"+name, caseState{Delayed: []caseMember{{member("a", extra), "{now-1000}"}, {member("b", ""), "{now-500}"}}},
			caseEvent{Type: "promote", Limit: 10})
	}
	add("typed/run/id", caseState{Delayed: []caseMember{{member("a", `,"type":"send_email"`), "{now+5000}"}}}, caseEvent{Type: "run", JobID: "a"})

	// Crash loops are counted by type; the registry fills across a batch.
	idle := func(id, t string, deliveries int) caseEntry {
		return caseEntry{ID: id, Fields: job("j"+id, 1, "type", t), Pend: &casePending{Consumer: "dead", Deliveries: deliveries, IdleMs: 120000}}
	}
	loops := []caseEntry{idle("1-1", "send_email", 5), idle("1-2", "charge_card", 5), idle("1-3", "render_report", 5),
		idle("1-4", "send_email", 5), idle("1-5", "charge_card", 1), {ID: "1-6", Fields: job("j6", 1), Pend: &casePending{Consumer: "dead", Deliveries: 5, IdleMs: 120000}}}
	add("typed/reclaim", caseState{Jobs: loops}, caseEvent{Type: "reclaim", MinIdleMs: 60000, Count: 10, MaxDeliveries: 5})
	add("typed/reclaim-limit-2", caseState{Jobs: loops, Stats: map[string]string{"types:limit": "2"}}, caseEvent{Type: "reclaim", MinIdleMs: 60000, Count: 10, MaxDeliveries: 5})
	add("typed/reclaim-dlq-refuses", caseState{Jobs: loops, Raw: [][]string{{"SET", "{q}:dlq", "x"}}}, caseEvent{Type: "reclaim", MinIdleMs: 60000, Count: 10, MaxDeliveries: 5})

	// Replay by type: only that type's dead letters move, their type kept.
	dead := func(id, jobID, reason string, t ...string) caseEntry {
		f := strs("reason", reason, "error", "boom", "attempt", "3", "id", jobID, "source_id", "1-9",
			"first_enqueued_ms", "{now-60000}", "payload", "p-"+jobID, "dead_lettered_ms", "{now-1000}")
		if len(t) > 0 {
			f = append(f, "type", t[0])
		}
		return caseEntry{ID: id, Fields: f}
	}
	dlq := []caseEntry{dead("1-1", "a", "max_attempts_reached", "send_email"), dead("1-2", "b", "permanent_error", "charge_card"),
		dead("1-3", "c", "max_attempts_reached"), dead("1-4", "d", "max_attempts_reached", "charge_card"),
		dead("1-5", "e", "crash_loop", ""), dead("1-6", "f", "max_attempts_reached", "send_email")}
	for _, t := range []string{"", "send_email", "charge_card", "render_report"} {
		for _, limit := range []int{1, 10} {
			add(fmt.Sprintf("typed/replay/type-%s/limit-%d", t, limit), caseState{DLQ: dlq}, caseEvent{Type: "replay", Limit: limit, JobType: t})
		}
	}
	add("typed/replay/type-and-reason", caseState{DLQ: dlq}, caseEvent{Type: "replay", Limit: 10, JobType: "charge_card", Reason: "max_attempts_reached"})
	for name, t := range map[string]string{"colon": "a:b", "too-long": strings.Repeat("t", 65), "space": "a b", "binary": "\x01"} {
		add("typed/replay/bad-type-"+name, caseState{DLQ: dlq}, caseEvent{Type: "replay", Limit: 10, JobType: t})
	}

	// Enqueue: typed, untyped, and types refused before anything is written.
	for name, t := range map[string]string{"untyped": "", "typed": "send_email", "longest": strings.Repeat("t", 64)} {
		add("enqueue/"+name, caseState{Stats: map[string]string{"enqueued": "4"}}, caseEvent{Type: "enqueue", JobID: "j1", Payload: "p1", JobType: t})
	}
	for name, t := range map[string]string{"too-long": strings.Repeat("t", 65), "colon": "a:b", "space": "a b", "binary": "b\x00", "unicode": "caf\u00e9"} {
		add("enqueue/bad-type-"+name, caseState{Stats: map[string]string{"enqueued": "4"}}, caseEvent{Type: "enqueue", JobID: "j1", Payload: "p1", JobType: t})
	}
	add("enqueue/empty-id", caseState{}, caseEvent{Type: "enqueue", JobID: "", Payload: "p1", JobType: "send_email"})
	add("enqueue/stats-a-string", caseState{Raw: [][]string{{"SET", "{q}:stats", "x"}}}, caseEvent{Type: "enqueue", JobID: "j1", Payload: "p1", JobType: "send_email"})
}

// plainCases: entries written by a producer that knows nothing of backstop
// (a plain XADD, queue/redisqueue/README.md "Plain producers") run as attempt 1, their
// id the entry's, first enqueued at the entry's time.
func plainCases(add func(string, caseState, caseEvent)) {
	const id = "{now-1000}-0"
	plain := func(fields ...string) caseState {
		return caseState{Jobs: []caseEntry{pendingJob(id, fields...)}}
	}
	on := func(ev caseEvent) caseEvent { ev.Entry = id; return ev }
	bodies := map[string][]string{
		"fields":        strs("to", "a@example.com", "subject", "hi"),
		"payload-field": strs("payload", `{"to":"a"}`, "trace", "t1"),
		"typed":         strs("type", "send_email", "to", "a"),
		"typed-payload": strs("type", "send_email", "payload", "p", "type", "charge_card"),
		"duplicates":    strs("k", "1", "k", "2", "a", "x"),
		"escapes":       strs("q\"uote", "back\\slash", "ctl", "a\x01b\nc\x1f\x7f", "tab", "\t"),
		"unicode-order": strs("\u00e9", "e-acute", "z", "zed", "Z", "Zed", "\U0001f600", "smile", "\uff5e", "wide"),
		"empty-values":  strs("a", "", "b", ""),
		"source-field":  strs("source", "x", "last_error", "boom", "prev_delay_ms", "5000"),
	}
	for name, f := range bodies {
		add("plain/"+name+"/read", plain(f...), on(caseEvent{Type: "read"}))
		add("plain/"+name+"/success", plain(f...), on(handle(nil)))
		add("plain/"+name+"/503", plain(f...), on(handle(httpErr(503, ""))))
		add("plain/"+name+"/400", plain(f...), on(handle(httpErr(400, ""))))
	}
	f := bodies["fields"]
	add("plain/defer", plain(f...), on(caseEvent{Type: "defer", Reason: "circuit_open", DelayMs: 30000}))
	add("plain/retry-after", plain(f...), on(handle(httpErr(429, "7"))))
	// An entry older than the policy's max_elapsed (1 h): its first
	// failure dead-letters it.
	old := caseState{Jobs: []caseEntry{pendingJob("1-1", f...)}}
	add("plain/old-entry/read", old, caseEvent{Type: "read", Entry: "1-1"})
	add("plain/old-entry/503", old, handle(httpErr(503, "")))
	// An entry id past 2^53-1 ms is no time a host reads exactly: malformed.
	huge := caseState{Jobs: []caseEntry{pendingJob("9007199254740992-0", f...)}}
	add("plain/id-past-2^53/read", huge, caseEvent{Type: "read", Entry: "9007199254740992-0"})
	add("plain/id-past-2^53/success", huge, caseEvent{Type: "handle", Entry: "9007199254740992-0"})
	top := caseState{Jobs: []caseEntry{pendingJob("9007199254740991-0", f...)}}
	add("plain/id-at-2^53-1/read", top, caseEvent{Type: "read", Entry: "9007199254740991-0"})
	// A crash loop of plain entries, and one reclaimed to run.
	idle := func(deliveries int) caseEntry {
		return caseEntry{ID: id, Fields: f, Pend: &casePending{Consumer: "c1", Deliveries: deliveries, IdleMs: 120000}}
	}
	add("plain/reclaim/crash-loop", caseState{Jobs: []caseEntry{idle(5)}}, caseEvent{Type: "reclaim", MinIdleMs: 60000, Count: 10, MaxDeliveries: 5})
	add("plain/reclaim/claimed-503", caseState{Jobs: []caseEntry{idle(1)}},
		caseEvent{Type: "reclaim", MinIdleMs: 60000, Count: 10, MaxDeliveries: 5, Error: httpErr(503, "")})
	// A plain job's dead letter replays as a backstop job.
	dl := caseEntry{ID: "1-1", Fields: strs("reason", "permanent_error", "error", "http 400", "attempt", "1", "id", "1700000000000-0",
		"source_id", "1700000000000-0", "first_enqueued_ms", "1700000000000", "payload", `{"to":"a"}`, "dead_lettered_ms", "{now-1000}")}
	add("plain/replay", caseState{DLQ: []caseEntry{dl}}, caseEvent{Type: "replay", Limit: 10})
	// The delayed member a plain job went back as runs as that job.
	add("plain/promote", caseState{Delayed: []caseMember{{`{"attempt":2,"first_enqueued_ms":1700000000000,"id":"1700000000000-0","last_error":"http 503","last_reason":"transient","payload":"{\"to\":\"a\"}","prev_delay_ms":1000,"source":"1700000000000-0"}`, "{now-1000}"}}},
		caseEvent{Type: "promote", Limit: 10})
}
