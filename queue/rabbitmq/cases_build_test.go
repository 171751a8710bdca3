package rabbitmq_test

import (
	"encoding/json"
	"strconv"
	"strings"
)

// The inputs of the shared RabbitMQ cases (testdata/rabbitmq/cases.json);
// `make rabbitmq-cases` runs them through the Go worker for the expected
// part.

// hdrs are a job's headers: attempt n, first enqueued a minute ago, to q.
func hdrs(attempt string, extra ...any) map[string]any {
	h := map[string]any{"backstop-attempt": attempt, "backstop-first-enqueued-ms": "{now-60000}", "backstop-destination": "q"}
	for i := 0; i+1 < len(extra); i += 2 {
		k := extra[i].(string)
		if extra[i+1] == nil {
			delete(h, k)
			continue
		}
		h[k] = extra[i+1]
	}
	return h
}

// msg is a job message j<id> with headers h.
func msg(id string, h map[string]any) json.RawMessage {
	m := map[string]any{"content_type": "application/json", "delivery_mode": 2, "body": `{"job":"` + id + `"}`}
	if id != "" {
		m["message_id"] = id
	}
	if h != nil {
		m["headers"] = h
	}
	out, _ := json.Marshal(m)
	return out
}

func handleCase(name string, h map[string]any, e *caseError) rabbitCase {
	return rabbitCase{Name: name, Delivery: &caseDelivery{Message: msg("j1", h)}, Event: rabbitEvent{Type: "handle", Error: e}}
}

func httpErr(status int) *caseError {
	return &caseError{Message: "http " + strconv.Itoa(status), HTTPStatus: status}
}

// deadLetter is a dead letter the worker wrote, with reason r.
func deadLetter(id, attempt, r string, extra ...any) json.RawMessage {
	h := hdrs(attempt, append([]any{"backstop-reason", r, "backstop-error", "http 503",
		"backstop-dead-lettered-ms", "{now-5000}"}, extra...)...)
	return msg(id, h)
}

func buildRabbitCases() []rabbitCase {
	var cs []rabbitCase
	add := func(c rabbitCase) { cs = append(cs, c) }

	// Success at the first, a middle and the largest attempt.
	for _, a := range []string{"1", "3", "99999999999999"} {
		add(handleCase("success/attempt-"+a, hdrs(a), nil))
	}
	// Attempt counting and every policy reason.
	add(handleCase("http/503/attempt-1", hdrs("1"), httpErr(503)))
	add(handleCase("http/503/attempt-2-after-a-retry", hdrs("2", "backstop-last-reason", "transient",
		"backstop-last-error", "http 503", "backstop-prev-delay-ms", "10000"), httpErr(503)))
	add(handleCase("http/503/attempt-3", hdrs("3"), httpErr(503)))
	add(handleCase("http/503/attempt-4-max-attempts", hdrs("4"), httpErr(503)))
	add(handleCase("http/503/attempt-9-past-max", hdrs("9"), httpErr(503)))
	add(handleCase("http/400/permanent", hdrs("1"), httpErr(400)))
	add(handleCase("http/404/permanent", hdrs("2"), httpErr(404)))
	add(handleCase("http/500/uncertain", hdrs("1"), httpErr(500)))
	add(handleCase("http/500/uncertain-limit", hdrs("2"), httpErr(500)))
	add(handleCase("http/429/retry-after-30", hdrs("1"), &caseError{Message: "http 429", HTTPStatus: 429, RetryAfter: "30"}))
	add(handleCase("http/429/retry-after-past-cap", hdrs("1"), &caseError{Message: "http 429", HTTPStatus: 429, RetryAfter: "120"}))
	add(handleCase("http/429/retry-after-garbage", hdrs("1"), &caseError{Message: "http 429", HTTPStatus: 429, RetryAfter: "soon"}))
	add(handleCase("http/503/retry-after-negative", hdrs("1"), &caseError{Message: "http 503", HTTPStatus: 503, RetryAfter: "-5"}))
	add(handleCase("grpc/14-unavailable", hdrs("1"), &caseError{Message: "unavailable", GRPCCode: 14}))
	add(handleCase("grpc/3-invalid-argument", hdrs("1"), &caseError{Message: "invalid argument", GRPCCode: 3}))
	add(handleCase("error-kind/timeout", hdrs("1"), &caseError{Message: "timed out", ErrorKind: "timeout"}))
	add(handleCase("error-kind/invalid_input", hdrs("1"), &caseError{Message: "bad input", ErrorKind: "invalid_input"}))
	add(handleCase("error-kind/none", hdrs("1"), &caseError{Message: "something broke"}))
	add(handleCase("native/connection_refused", hdrs("1"), &caseError{Message: "connect refused", Native: "connection_refused"}))
	add(handleCase("native/timeout", hdrs("1"), &caseError{Message: "deadline", Native: "timeout"}))
	// The handler's own retry loop gave up (retry at one layer): dead-
	// lettered as retried_downstream; a breaker's refusal is decided by
	// what it says.
	add(handleCase("inner-retry/max_attempts_reached", hdrs("1"), &caseError{Message: "http 503", HTTPStatus: 503, InnerRetry: "max_attempts_reached"}))
	add(handleCase("inner-retry/permanent_error", hdrs("1"), &caseError{Message: "http 400", HTTPStatus: 400, InnerRetry: "permanent_error"}))
	add(handleCase("inner-retry/native-timeout", hdrs("2"), &caseError{Message: "deadline", Native: "timeout", InnerRetry: "max_elapsed_exceeded"}))
	add(handleCase("inner-retry/circuit_open", hdrs("1"), &caseError{Message: "inner breaker open", InnerRetry: "circuit_open"}))
	// The handler overran the worker's deadline: the worker's own deadline
	// error, a timeout, decided as any failure.
	for _, a := range []string{"1", "4"} {
		add(rabbitCase{Name: "deadline/attempt-" + a, Delivery: &caseDelivery{Message: msg("j1", hdrs(a))},
			Event: rabbitEvent{Type: "handle", Deadline: true}})
	}
	// The time budget (1 h): a retry due past it is not scheduled.
	add(handleCase("elapsed/retry-past-budget", hdrs("1", "backstop-first-enqueued-ms", "{now-3595000}"), httpErr(503)))
	add(handleCase("elapsed/within-budget", hdrs("1", "backstop-first-enqueued-ms", "{now-3000000}"), httpErr(503)))
	// The job type and other properties travel with every move.
	add(handleCase("job-type/kept-through-retry", hdrs("1", "backstop-job-type", "send_email", "tenant", "acme"), httpErr(503)))
	add(handleCase("job-type/kept-in-dead-letter", hdrs("1", "backstop-job-type", "send_email"), httpErr(400)))
	// AMQP integers are accepted where digits are expected.
	add(handleCase("amqp-integer/attempt-and-first-enqueued", hdrs("", "backstop-attempt", map[string]any{"int": "2"},
		"backstop-first-enqueued-ms", map[string]any{"int": "{now-60000}"}), httpErr(503)))

	// Malformed deliveries: dead-lettered as malformed, never run.
	malformed := []struct {
		name string
		h    map[string]any
	}{
		{"attempt-missing", hdrs("", "backstop-attempt", nil)},
		{"attempt-empty", hdrs("")},
		{"attempt-garbage", hdrs("abc")},
		{"attempt-zero", hdrs("0")},
		{"attempt-negative", hdrs("-1")},
		{"attempt-float-text", hdrs("1.5")},
		{"attempt-float", hdrs("", "backstop-attempt", map[string]any{"float": 1.5})},
		{"attempt-1e14", hdrs("100000000000000")}, // 15 digits: past the Redis scripts' 14
		{"attempt-above-1e14", hdrs("100000000000001")},
		{"attempt-overlong", hdrs("100000000000000000000000000000")},
		{"attempt-amqp-negative", hdrs("", "backstop-attempt", map[string]any{"int": "-3"})},
		{"attempt-binary", hdrs("", "backstop-attempt", map[string]any{"bytes": "MQ=="})},
		{"attempt-leading-space", hdrs(" 1")},
		{"first-enqueued-missing", hdrs("1", "backstop-first-enqueued-ms", nil)},
		{"first-enqueued-not-digits", hdrs("1", "backstop-first-enqueued-ms", "12a")},
		{"first-enqueued-negative", hdrs("1", "backstop-first-enqueued-ms", "-5")},
		{"first-enqueued-binary", hdrs("1", "backstop-first-enqueued-ms", map[string]any{"bytes": "AP8="})},
	}
	for _, m := range malformed {
		add(handleCase("malformed/"+m.name, m.h, httpErr(503)))
	}
	add(rabbitCase{Name: "malformed/no-message-id", Delivery: &caseDelivery{Message: msg("", hdrs("1"))},
		Event: rabbitEvent{Type: "handle"}})
	plainCases(add)
	add(rabbitCase{Name: "malformed/binary-body-kept", Delivery: &caseDelivery{Message: json.RawMessage(
		`{"message_id":"j1","delivery_mode":2,"headers":{"backstop-attempt":"x"},"body_base64":"AP8AgA=="}`)},
		Event: rabbitEvent{Type: "handle"}})

	// Crash loops: a delivery the broker has returned max_deliveries times
	// (its consumers died) is dead-lettered without running.
	for _, r := range []int{4, 5, 7} {
		c := handleCase("crash-loop/returns-"+strconv.Itoa(r), hdrs("2"), nil)
		c.Delivery.Returns = r
		add(c)
	}
	// A first delivery (not redelivered) whose x-delivery-count another
	// publisher copied runs: the count is the broker's on a redelivery only;
	// and backstop's next message does not carry it.
	add(handleCase("crash-loop/first-delivery-foreign-count", hdrs("2", "x-delivery-count", map[string]any{"int": "99"}), nil))
	add(handleCase("crash-loop/first-delivery-foreign-count-retried", hdrs("2", "x-delivery-count", map[string]any{"int": "99"}), httpErr(503)))
	// An error text over 8192 bytes is truncated on a character boundary
	// with its marker, in a retry's last error and a dead letter's error.
	huge := &caseError{Message: strings.Repeat("€", 3000) + " the end"}
	add(handleCase("bounds/huge-error-retried", hdrs("1"), huge))
	add(handleCase("bounds/huge-error-dead-lettered", hdrs("4"), huge))
	// A header table over 64 KiB loses its largest foreign headers, named.
	add(handleCase("bounds/foreign-headers-over-64k", hdrs("1", "big-a", strings.Repeat("a", 40000),
		"big-b", strings.Repeat("b", 30000), "small", "kept"), httpErr(503)))
	// Early deliveries are delayed again for the rest, without an attempt.
	// The offsets end in 999 ms so that the rounding up to whole seconds
	// gives one answer while the case takes under a second.
	add(handleCase("early/due-in-20s", hdrs("2", "backstop-due-ms", "{now+20999}"), httpErr(503)))
	add(handleCase("early/due-in-3h", hdrs("1", "backstop-due-ms", "{now+10800999}"), nil))
	add(handleCase("early/due-passed", hdrs("2", "backstop-due-ms", "{now-1000}"), nil))
	add(handleCase("early/due-garbage", hdrs("2", "backstop-due-ms", "soon"), nil))
	// Due more than 30 days ahead: malformed, never cycling the levels.
	add(handleCase("early/due-1e17-malformed", hdrs("2", "backstop-due-ms", "100000000000000000"), nil))
	add(handleCase("early/due-31-days-malformed", hdrs("2", "backstop-due-ms", "{now+2678400000}"), nil))
	// A breaker refusal defers the job without spending an attempt.
	for _, a := range []string{"1", "4"} {
		c := handleCase("refused/circuit-open/attempt-"+a, hdrs(a, "backstop-job-type", "send_email"), nil)
		c.Event.Refuse = &struct {
			Reason    string `json:"reason"`
			RetryInMs int64  `json:"retry_in_ms"`
		}{"circuit_open", 30000}
		add(c)
	}

	// Replay: bounded, filtered by reason, to the original queue only.
	dlq := []json.RawMessage{
		deadLetter("d1", "4", "max_attempts_reached"),
		deadLetter("d2", "1", "permanent_error", "backstop-job-type", "send_email"),
		deadLetter("d3", "3", "max_attempts_reached", "backstop-last-reason", "transient"),
		// Dead-lettered by the broker at its delivery limit: no backstop-reason.
		msg("d4", hdrs("2", "x-death", map[string]any{"array": []any{map[string]any{"table": map[string]any{
			"reason": "delivery_limit", "queue": "q", "count": map[string]any{"int": "1"}, "exchange": "",
			"routing-keys": map[string]any{"array": []any{"q"}}, "time": map[string]any{"timestamp": 1700000000}}}}},
			"x-first-death-reason", "delivery_limit", "x-first-death-queue", "q")),
		// No job id: stays for a person.
		msg("", hdrs("1", "backstop-reason", "malformed", "backstop-error", "malformed message")),
	}
	replay := func(name string, limit int, reason string, keep bool) {
		add(rabbitCase{Name: "replay/" + name, DLQ: dlq, Event: rabbitEvent{Type: "replay", Limit: limit, Reason: reason, KeepAttempts: keep}})
	}
	replay("limit-1", 1, "", false)
	replay("limit-2-max-attempts", 2, "max_attempts_reached", false)
	replay("limit-10-all", 10, "", false)
	replay("reason-permanent", 10, "permanent_error", false)
	replay("reason-crash-loop", 10, "crash_loop", false)
	replay("reason-none-match", 10, "transient", false)
	replay("keep-attempts", 10, "max_attempts_reached", true)
	replay("reason-malformed-no-id-stays", 10, "malformed", false)
	replay("limit-0-refused", 0, "", false)
	replay("limit-negative-refused", -1, "", false)
	replay("reason-unknown-refused", 1, "no_such_reason", false)
	add(rabbitCase{Name: "replay/empty-dlq", Event: rabbitEvent{Type: "replay", Limit: 5}})
	return cs
}

// plainCases: messages a publisher that knows nothing of backstop sent (no
// backstop-attempt nor backstop-first-enqueued-ms) run as attempt 1, their
// id the message_id, first enqueued at their timestamp or on receipt; one
// without message_id is adopted first (published again with an id
// "amqp-" + 32 hex digits, written {adopted_id} in the file).
func plainCases(add func(rabbitCase)) {
	plain := func(id string, ts int64, h map[string]any) json.RawMessage {
		m := map[string]any{"content_type": "application/json", "delivery_mode": 2, "body": `{"to":"a"}`}
		if id != "" {
			m["message_id"] = id
		}
		if ts != 0 {
			m["timestamp"] = ts
		}
		if h != nil {
			m["headers"] = h
		}
		out, _ := json.Marshal(m)
		return out
	}
	for _, v := range []struct {
		name string
		id   string
		ts   int64
		h    map[string]any
	}{
		{"no-headers", "m1", 0, nil},
		{"no-message-id", "", 0, nil},
		{"other-headers", "m1", 0, map[string]any{"__TypeId__": "com.example.Mail", "spring_listener": "x"}},
		{"typed", "m1", 0, map[string]any{"backstop-job-type": "send_email"}},
		{"old-timestamp", "m1", 1700000000, nil},
		{"no-message-id-other-headers", "", 0, map[string]any{"__TypeId__": "com.example.Mail"}},
		{"foreign-delivery-count", "m1", 0, map[string]any{"x-delivery-count": map[string]any{"int": "99"}}},
	} {
		for _, e := range []struct {
			name string
			err  *caseError
		}{{"success", nil}, {"503", httpErr(503)}, {"400", httpErr(400)}} {
			add(rabbitCase{Name: "plain/" + v.name + "/" + e.name, Delivery: &caseDelivery{Message: plain(v.id, v.ts, v.h)},
				Event: rabbitEvent{Type: "handle", Error: e.err}})
		}
	}
}
