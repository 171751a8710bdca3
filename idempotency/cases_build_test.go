package idempotency_test

import (
	"encoding/base64"
	"strings"

	"github.com/backstop-dev/backstop/internal/testing/idemcases"
)

type (
	caseStep = idemcases.Step
	idemCase = idemcases.Case
)

// buildCases lists the shared idempotency cases' inputs (testdata/idempotency);
// the expected replies and final records come from running them through the
// Go store (TestIdempotencyCases -update).

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func begin(caller, request string) caseStep {
	return caseStep{Caller: caller, Op: "begin", Request: request}
}
func complete(caller string, status int, body string) caseStep {
	return caseStep{Caller: caller, Op: "complete", Status: status, Headers: map[string][]string{"Content-Type": {"application/json"}}, Body: b64(body)}
}
func fail(caller string) caseStep { return caseStep{Caller: caller, Op: "fail"} }

var (
	lapse  = caseStep{Op: "lapse"}  // the lease runs out (lease_until set to the past)
	expire = caseStep{Op: "expire"} // the retention runs out (the record is deleted)
)

func buildCases() []idemCase {
	var cs []idemCase
	add := func(name string, steps ...caseStep) { cs = append(cs, idemCase{Name: name, Steps: steps}) }

	add("first-run", begin("A", "r1"))
	add("first-run/complete", begin("A", "r1"), complete("A", 201, `{"id":"ch_1"}`))
	add("replay", begin("A", "r1"), complete("A", 201, `{"id":"ch_1"}`), begin("B", "r1"))
	add("replay/twice", begin("A", "r1"), complete("A", 201, `{"id":"ch_1"}`), begin("B", "r1"), begin("C", "r1"))
	add("replay/error-stored", begin("A", "r1"), complete("A", 400, `{"error":"card_declined"}`), begin("B", "r1"))
	add("replay/empty-body", begin("A", "r1"), complete("A", 204, ""), begin("B", "r1"))
	add("replay/no-headers", begin("A", "r1"), caseStep{Caller: "A", Op: "complete", Status: 200, Body: b64("ok")}, begin("B", "r1"))
	add("replay/many-headers", begin("A", "r1"), caseStep{Caller: "A", Op: "complete", Status: 201,
		Headers: map[string][]string{"Content-Type": {"text/plain; charset=utf-8"}, "Location": {"/charges/1"}, "Set-Cookie": {"a=1", "b=2"}},
		Body:    b64("é ✓")}, begin("B", "r1"))
	// Two concurrent callers: the second waits (409 and Retry-After).
	add("concurrent/in-progress", begin("A", "r1"), begin("B", "r1"))
	add("concurrent/in-progress-then-replay", begin("A", "r1"), begin("B", "r1"), complete("A", 201, "done"), begin("B", "r1"))
	add("concurrent/second-cannot-complete", begin("A", "r1"), begin("B", "r1"), complete("B", 201, "mine"), complete("A", 201, "done"), begin("C", "r1"))
	add("concurrent/second-cannot-fail", begin("A", "r1"), begin("B", "r1"), fail("B"), begin("C", "r1"))
	// Body mismatch: the same key with another request, in every state.
	add("conflict/in-progress", begin("A", "r1"), begin("B", "r2"))
	add("conflict/completed", begin("A", "r1"), complete("A", 201, "done"), begin("B", "r2"))
	add("conflict/after-lapse", begin("A", "r1"), lapse, begin("B", "r2"))
	add("conflict/after-fail", begin("A", "r1"), fail("A"), begin("B", "r2"))
	// Fail releases the key: a retry runs.
	add("fail/release", begin("A", "r1"), fail("A"), begin("B", "r1"))
	add("fail/twice", begin("A", "r1"), fail("A"), fail("A"))
	add("fail/after-complete", begin("A", "r1"), complete("A", 201, "done"), fail("A"), begin("B", "r1"))
	add("complete/twice", begin("A", "r1"), complete("A", 201, "done"), complete("A", 500, "again"), begin("B", "r1"))
	// A crash mid-request: the lease runs out, the next caller takes over,
	// and the crashed owner can neither complete nor fail.
	add("crash/take-over", begin("A", "r1"), lapse, begin("B", "r1"))
	add("crash/late-complete", begin("A", "r1"), lapse, begin("B", "r1"), complete("A", 201, "late"), complete("B", 201, "second"), begin("C", "r1"))
	add("crash/late-fail", begin("A", "r1"), lapse, begin("B", "r1"), fail("A"), begin("C", "r1"))
	add("crash/owner-completes-past-lease", begin("A", "r1"), lapse, complete("A", 201, "slow"), begin("B", "r1"))
	// Retention expiry: the record is gone; a retry runs again, the owner
	// cannot complete.
	add("expire/completed", begin("A", "r1"), complete("A", 201, "done"), expire, begin("B", "r1"))
	add("expire/in-progress", begin("A", "r1"), expire, complete("A", 201, "done"), begin("B", "r2"))
	add("never-begun/complete", complete("A", 201, "done"))
	add("never-begun/fail", fail("A"))
	// A huge response: stored as too large, never replayed truncated.
	add("huge/too-large", begin("A", "r1"), complete("A", 200, strings.Repeat("x", 1025)), begin("B", "r1"))
	add("huge/at-limit", begin("A", "r1"), complete("A", 200, strings.Repeat("x", 1024)), begin("B", "r1"))
	// Binary bodies survive byte for byte.
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	add("binary/all-bytes", begin("A", "r1"), caseStep{Caller: "A", Op: "complete", Status: 200,
		Headers: map[string][]string{"Content-Type": {"application/octet-stream"}}, Body: base64.StdEncoding.EncodeToString(all)}, begin("B", "r1"))
	// Headers no HTTP server of another language would send are stored and
	// replayed as SafeHeader has them: a name that is not a token dropped,
	// a value's bytes outside visible ASCII written %XX.
	add("headers/hostile", begin("A", "r1"), caseStep{Caller: "A", Op: "complete", Status: 201,
		Headers: map[string][]string{
			"Location": {"/orders/€42"}, "X Odd:Name": {"v"}, "X-Control": {"/charges/1\x01"}, "X-Split": {"a\r\nSet-Cookie: x=1"},
			"X-Trimmed": {" \t padded value \t "}, "X-Spaces": {"a  b", "a\tb", "a ☃"}, "X-Visible": {"100%25 ok; q=\"x\""},
			"X-Empty": {""}, "X-Snowman": {"/charges/☃"},
		}, Body: b64("{}")}, begin("B", "r1"))
	add("headers/all-dropped", begin("A", "r1"), caseStep{Caller: "A", Op: "complete", Status: 200,
		Headers: map[string][]string{"X Odd:Name": {"v"}, "": {"v"}, "Bad\r\nName": {"v"}, "Ünicode": {"v"}}, Body: b64("ok")}, begin("B", "r1"))
	// A record stored before the rule (by any adapter): the replay applies
	// it; the record itself is left as it is.
	add("headers/stored-before", caseStep{Op: "write", Fields: map[string]string{
		"state": "completed", "request": "r1", "status": "201", "too_large": "0", "body": b64(`{"id":"ord_42"}`),
		"headers": `{"Location":["/orders/€42"],"X Odd:Name":["v"],"X-Control":["/charges/1\u0001"],"Content-Type":["application/json"]}`,
	}}, begin("B", "r1"))
	// The client left mid-response: the record is completed with what was
	// captured, marked truncated, and replayed as it is.
	add("truncated/replay", begin("A", "r1"), caseStep{Caller: "A", Op: "complete", Status: 200,
		Headers: map[string][]string{"Content-Type": {"text/plain"}}, Body: b64("partial"), Truncated: true}, begin("B", "r1"))
	add("truncated/too-large", begin("A", "r1"), caseStep{Caller: "A", Op: "complete", Status: 200,
		Body: b64(strings.Repeat("x", 1025)), Truncated: true}, begin("B", "r1"))
	add("truncated/late-complete", begin("A", "r1"), caseStep{Caller: "A", Op: "complete", Status: 200, Body: b64("part"), Truncated: true},
		complete("A", 201, "whole"), begin("B", "r1"))
	return cs
}
