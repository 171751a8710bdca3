package redisqueue

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/testing/casetest"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
)

// The shared queue cases (testdata/queue/cases.json, see its README): a
// starting state, an event driven through the worker's path (run, then one
// attempt at applying the outcome), and the state after. `make queue-cases`
// regenerates the file from this applier (-update); without -update the
// test replays every case and compares.
var updateCases = flag.Bool("update", false, "regenerate testdata/queue/cases.json from the Go applier")

const casesFile = "../../testdata/queue/cases.json"

type caseFile struct {
	Comment  string          `json:"comment"`
	Queue    string          `json:"queue"`
	Group    string          `json:"group"`
	Consumer string          `json:"consumer"`
	Policy   json.RawMessage `json:"policy"`
	Cases    []queueCase     `json:"cases"`
}

type queueCase struct {
	Name   string     `json:"name"`
	State  caseState  `json:"state"`
	Event  caseEvent  `json:"event"`
	Expect caseExpect `json:"expect"`
}

type caseState struct {
	Jobs    []caseEntry       `json:"jobs,omitempty"`
	Delayed []caseMember      `json:"delayed,omitempty"`
	DLQ     []caseEntry       `json:"dlq,omitempty"`
	Stats   map[string]string `json:"stats,omitempty"`
	// Raw are Redis commands run after the rest: damage (a key of the
	// wrong type, a deleted entry, a stream at its largest id).
	Raw [][]string `json:"raw,omitempty"`
}

type caseEntry struct {
	ID     string       `json:"id"`
	Fields []string     `json:"fields"`
	Pend   *casePending `json:"pending,omitempty"`
}

type casePending struct {
	Consumer   string `json:"consumer"`
	Deliveries int    `json:"deliveries"`
	IdleMs     int64  `json:"idle_ms"`
}

type caseMember struct {
	Member string `json:"member"`
	Score  string `json:"score"`
}

type caseEvent struct {
	// Type: handle (the worker ran the entry's job), defer, promote, run,
	// reclaim (then the reclaimed jobs run), replay, enqueue, hold.
	Type  string     `json:"type"`
	Entry string     `json:"entry,omitempty"`
	Error *caseError `json:"error,omitempty"` // handle, reclaim: nil is a success
	// Deadline (handle): the handler overran the worker's deadline; the
	// failure is the worker's own deadline error.
	Deadline bool `json:"deadline,omitempty"`
	// hold: Entries held by Consumer.
	Consumer string   `json:"consumer,omitempty"`
	Entries  []string `json:"entries,omitempty"`
	Limit    int      `json:"limit,omitempty"`
	// Reason filters replay; for defer, why the policy refused the job
	// (circuit_open, budget_exhausted).
	Reason string `json:"reason,omitempty"`
	// defer: the policy refused to run the job of entry (an open breaker,
	// an empty budget); it waits DelayMs, LastError ("" keeps the entry's).
	DelayMs       int64  `json:"delay_ms,omitempty"`
	LastError     string `json:"last_error,omitempty"`
	MinIdleMs     int64  `json:"min_idle_ms,omitempty"`
	Count         int    `json:"count,omitempty"`
	MaxDeliveries int    `json:"max_deliveries,omitempty"`
	// run: the delayed job with job id JobID, or those due at or before
	// Before (a "{now±N}" time) with Limit.
	JobID  string `json:"job_id,omitempty"`
	Before string `json:"before,omitempty"`
	// enqueue: JobID, Payload and JobType ("" untyped); replay: only the
	// dead letters of JobType.
	Payload string `json:"payload,omitempty"`
	JobType string `json:"job_type,omitempty"`
}

type caseError = casetest.Error

// spyDecider reports the classification of the failure the policy was
// asked about (what differs between languages is caught there): the fields
// that are set, by their policy-file names.
type spyDecider struct {
	backstop.Decider
	asked map[string]any
}

func (s *spyDecider) Outcome(ctx context.Context, e policy.JobEvent) (policy.Outcome, error) {
	if e.Event != policy.EventFailure {
		return s.Decider.Outcome(ctx, e)
	}
	f := e.Failure
	s.asked = map[string]any{}
	for k, v := range map[string]any{"http_status": f.HTTPStatus, "grpc_code": f.GRPCCode, "error_kind": f.ErrorKind,
		"retry_after": f.RetryAfter, "method": f.Method, "retried_downstream": f.RetriedDownstream, "server_declined": f.ServerDeclined} {
		if v != 0 && v != "" && v != false {
			s.asked[k] = v
		}
	}
	return s.Decider.Outcome(ctx, e)
}

type caseExpect struct {
	Reply any            `json:"reply"`
	State map[string]any `json:"state"`
}

const casePolicy = `{"max_attempts": 4, "max_elapsed": "1h", "uncertain": {"max_attempts": 2},
 "backoff": {"strategy": "exponential", "base": "1s", "multiplier": 2, "cap": "60s"},
 "jitter": {"mode": "none"}, "retry_after": {"cap": "30s", "on_exceed": "give_up"}}`

func TestQueueCases(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	var file caseFile
	if *updateCases {
		file = caseFile{
			Comment: "generated by `make queue-cases` (queue/cases_test.go); see README.md",
			Queue:   "q", Group: "workers", Consumer: "c9", Policy: json.RawMessage(casePolicy), Cases: buildCases(),
		}
	} else {
		casetest.Read(t, casesFile, &file)
	}
	p, err := policy.Parse(file.Policy)
	if err != nil {
		t.Fatal(err)
	}
	casetest.UniqueNames(t, file.Cases, func(c queueCase) string { return c.Name })
	for i := range file.Cases {
		c := &file.Cases[i]
		q := New(rdb, file.Queue, WithGroup(file.Group))
		reply, state := replayCase(t, ctx, rdb, q, backstop.Native(p), file.Consumer, c)
		if *updateCases {
			c.Expect = caseExpect{Reply: reply, State: state}
			continue
		}
		got, _ := json.Marshal(caseExpect{Reply: reply, State: state})
		want, _ := json.Marshal(c.Expect)
		if string(got) != string(want) {
			t.Errorf("case %s:\n got  %s\n want %s", c.Name, got, want)
		}
	}
	if *updateCases {
		casetest.Write(t, casesFile, file)
	}
	if n := len(file.Cases); n < 200 {
		t.Errorf("%d cases, want at least 200", n)
	}
	if *updateCases {
		return
	}
	// The same cases on a Redis Cluster: every key of a queue shares its
	// hash tag, so each script runs on one node, and must reach the same
	// state there.
	t.Run("cluster", func(t *testing.T) {
		cc := redistest.StartCluster(t, 3).Client(t)
		for i := range file.Cases {
			c := &file.Cases[i]
			q := New(cc, file.Queue, WithGroup(file.Group))
			reply, state := replayCase(t, ctx, cc, q, backstop.Native(p), file.Consumer, c)
			got, _ := json.Marshal(caseExpect{Reply: reply, State: state})
			want, _ := json.Marshal(c.Expect)
			if string(got) != string(want) {
				t.Errorf("case %s on a cluster:\n got  %s\n want %s", c.Name, got, want)
			}
		}
	})
}

// allKeys lists every key, on every master of a cluster.
func allKeys(ctx context.Context, rdb redis.UniversalClient) ([]string, error) {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return rdb.Keys(ctx, "*").Result()
	}
	var mu sync.Mutex
	var keys []string
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		ks, err := c.Keys(ctx, "*").Result()
		mu.Lock()
		keys = append(keys, ks...)
		mu.Unlock()
		return err
	})
	return keys, err
}

// flushAll empties the server, every master of a cluster.
func flushAll(ctx context.Context, rdb redis.UniversalClient) error {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.FlushAll(ctx).Err() })
	}
	return rdb.FlushAll(ctx).Err()
}

func serverMs(t *testing.T, ctx context.Context, rdb redis.UniversalClient) int64 {
	tm, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	return tm.UnixMilli()
}

// replayCase sets up c's state, drives its event through the Go applier and
// returns the reply and the normalised state after.
func replayCase(t *testing.T, ctx context.Context, rdb redis.UniversalClient, q *Queue, p backstop.Decider, consumer string, c *queueCase) (any, map[string]any) {
	t.Helper()
	fail := func(err error) {
		if err != nil {
			t.Fatalf("case %s: setup: %v", c.Name, err)
		}
	}
	fail(flushAll(ctx, rdb))
	base := serverMs(t, ctx, rdb)
	known := map[int64]bool{0: true}
	k := q.keys
	c = resolveIDs(c, base, known)
	addEntries := func(key string, es []caseEntry) {
		for _, e := range es {
			vals := make([]any, len(e.Fields))
			for i, f := range e.Fields {
				vals[i] = casetest.Resolve(f, base, known)
			}
			fail(rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, ID: e.ID, Values: vals}).Err())
		}
	}
	addEntries(k.Jobs, c.State.Jobs)
	fail(rdb.XGroupCreateMkStream(ctx, k.Jobs, q.group, "0").Err())
	for _, e := range c.State.Jobs {
		if e.Pend != nil {
			fail(rdb.Do(ctx, "XCLAIM", k.Jobs, q.group, e.Pend.Consumer, 0, e.ID, "IDLE", e.Pend.IdleMs,
				"RETRYCOUNT", e.Pend.Deliveries, "FORCE", "JUSTID").Err())
		}
	}
	addEntries(k.DLQ, c.State.DLQ)
	for _, m := range c.State.Delayed {
		score, err := strconv.ParseFloat(casetest.Resolve(m.Score, base, known), 64)
		fail(err)
		fail(rdb.ZAdd(ctx, k.Delayed, redis.Z{Score: score, Member: casetest.Resolve(m.Member, base, known)}).Err())
	}
	for f, v := range c.State.Stats {
		fail(rdb.HSet(ctx, k.Stats, f, casetest.Resolve(v, base, known)).Err())
	}
	for _, cmd := range c.State.Raw {
		args := make([]any, len(cmd))
		for i, a := range cmd {
			args[i] = casetest.Resolve(a, base, known)
		}
		fail(rdb.Do(ctx, args...).Err())
	}

	runOpts := []queue.Option{queue.WithRandom(func() float64 { return 0.5 }), queue.WithLogger(slog.New(slog.DiscardHandler))}
	// A deadline case's handler overruns, ignoring its ctx, until the case
	// is over: the worker's own deadline ends the attempt.
	overrun := make(chan struct{})
	defer close(overrun)
	if c.Event.Deadline {
		runOpts = append(runOpts, queue.WithHandlerTimeout(caseHandlerTimeout))
	}
	h := func(context.Context, queue.Job) error {
		if c.Event.Deadline {
			<-overrun
			return nil
		}
		if c.Event.Error == nil {
			return nil
		}
		e := c.Event.Error
		return e.Handle(t, func() error {
			return &backstop.Failure{Err: fmt.Errorf("%s", e.Message), HTTPStatus: e.HTTPStatus, GRPCCode: e.GRPCCode, ErrorKind: e.ErrorKind, RetryAfter: e.RetryAfter}
		})
	}
	apply := func(j queue.Job) map[string]any {
		spy := &spyDecider{Decider: p}
		o := malformed
		if !j.Malformed {
			r, err := queue.NewRunner(q.name, spy, runOpts...)
			fail(err)
			o = r.Run(ctx, h, j)
		}
		applied, err := q.applyOutcome(ctx, j.EntryID, o)
		if err != nil {
			// What a worker in another language knows of a refused outcome.
			return map[string]any{"refused": true}
		}
		r := map[string]any{"action": o.Action, "reason": o.Reason, "applied": applied}
		if spy.asked != nil {
			r["failure"] = spy.asked
		}
		if o.Action == queue.Retry {
			r["delay_ms"] = o.Delay.Milliseconds()
			known[o.Delay.Milliseconds()] = true
		}
		return r
	}
	var reply any
	switch ev := c.Event; ev.Type {
	case "read":
		msgs, err := rdb.XRangeN(ctx, k.Jobs, ev.Entry, ev.Entry, 1).Result()
		fail(err)
		if len(msgs) != 1 {
			t.Fatalf("case %s: no entry %s to read", c.Name, ev.Entry)
		}
		reply = map[string]any{"job": readReply(jobFromMessage(msgs[0]))}
	case "handle":
		msgs, err := rdb.XRangeN(ctx, k.Jobs, ev.Entry, ev.Entry, 1).Result()
		fail(err)
		j := queue.Job{EntryID: ev.Entry, Malformed: true}
		if len(msgs) == 1 {
			j = jobFromMessage(msgs[0])
		}
		reply = apply(j)
	case "defer":
		o := queue.Outcome{Action: queue.Defer, Reason: ev.Reason, Delay: time.Duration(ev.DelayMs) * time.Millisecond, LastError: ev.LastError}
		known[ev.DelayMs] = true
		applied, err := q.applyOutcome(ctx, ev.Entry, o)
		reply = map[string]any{"action": "defer", "reason": ev.Reason, "applied": applied, "delay_ms": ev.DelayMs}
		if err != nil {
			reply = map[string]any{"refused": true}
		}
	case "promote":
		n, next, err := q.Promote(ctx, ev.Limit)
		reply = map[string]any{"moved": n, "next_due": next >= 0}
		if err != nil {
			reply = map[string]any{"refused": true}
		}
	case "reclaim":
		rec, err := q.Reclaim(ctx, consumer, time.Duration(ev.MinIdleMs)*time.Millisecond, ev.Count, ev.MaxDeliveries)
		claimed, skipped, outcomes := []string{}, [][]string{}, []any{}
		for _, j := range rec.Jobs {
			claimed = append(claimed, j.EntryID)
		}
		for _, s := range rec.Skipped {
			skipped = append(skipped, []string{s.EntryID, s.Reason})
		}
		for _, j := range rec.Jobs {
			outcomes = append(outcomes, apply(j))
		}
		reply = map[string]any{"dead_lettered": rec.DeadLettered, "claimed": claimed, "skipped": skipped, "outcomes": outcomes}
		if err != nil {
			reply = map[string]any{"refused": true}
		}
	case "run":
		opts := []RunOption{RunID(ev.JobID)}
		if ev.Before != "" {
			ms, err := strconv.ParseInt(casetest.Resolve(ev.Before, base, known), 10, 64)
			fail(err)
			opts = []RunOption{RunDueBefore(time.UnixMilli(ms)), RunLimit(ev.Limit)}
		}
		ran, err := q.Run(ctx, opts...)
		reply = map[string]any{"moved": ran.Moved, "left": ran.Left}
		if err != nil {
			reply = map[string]any{"refused": true}
		}
	case "enqueue":
		id, err := q.Enqueue(ctx, ev.JobID, []byte(ev.Payload), WithJobType(ev.JobType))
		reply = map[string]any{"entry": id}
		if err != nil {
			reply = map[string]any{"refused": true}
		}
	case "hold":
		held, err := q.Hold(ctx, ev.Consumer, ev.Entries...)
		reply = map[string]any{"held": held}
		if err != nil {
			reply = map[string]any{"refused": true}
		}
	case "replay":
		var opts []ReplayOption
		if ev.JobType != "" {
			opts = append(opts, ReplayJobType(ev.JobType))
		}
		n, err := q.Replay(ctx, ev.Limit, ev.Reason, opts...)
		reply = map[string]any{"replayed": n}
		if err != nil {
			reply = map[string]any{"refused": true}
		}
	default:
		t.Fatalf("case %s: unknown event %q", c.Name, ev.Type)
	}
	end := serverMs(t, ctx, rdb)
	state := dumpState(t, ctx, rdb, q)
	var text string
	if c.Event.Deadline {
		text = caseDeadlineText
	}
	return normalise(t, reply, state, base, end, known, text)
}

// caseHandlerTimeout is the deadline of the deadline cases' worker, and
// caseDeadlineText the text of the worker's deadline error at it.
const (
	caseHandlerTimeout = 50 * time.Millisecond
	caseDeadlineText   = "handler deadline exceeded after 50ms"
)

// dumpState reads every key of the server: streams with their entries and
// consumer groups (last delivered id, pending entries with consumer and
// delivery count), sorted sets with scores, hashes, strings.
func dumpState(t *testing.T, ctx context.Context, rdb redis.UniversalClient, q *Queue) map[string]any {
	keys, err := allKeys(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(keys)
	names := map[string]string{q.keys.Jobs: "jobs", q.keys.Delayed: "delayed", q.keys.DLQ: "dlq", q.keys.Stats: "stats"}
	out := map[string]any{}
	for _, key := range keys {
		name, ok := names[key]
		if !ok {
			name = key
		}
		typ, _ := rdb.Type(ctx, key).Result()
		switch typ {
		case "stream":
			// Raw XRANGE: the fields as the ordered list they are.
			raw, _ := rdb.Do(ctx, "XRANGE", key, "-", "+").Slice()
			entries := []any{}
			for _, r := range raw {
				e := r.([]any)
				entries = append(entries, []any{e[0], e[1]})
			}
			groups := []any{}
			gs, _ := rdb.XInfoGroups(ctx, key).Result()
			for _, g := range gs {
				pend := []any{}
				ps, _ := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: key, Group: g.Name, Start: "-", End: "+", Count: 10000}).Result()
				for _, p := range ps {
					pend = append(pend, []any{p.ID, p.Consumer, p.RetryCount})
				}
				groups = append(groups, map[string]any{"name": g.Name, "last_delivered_id": g.LastDeliveredID, "pending": pend})
			}
			out[name] = map[string]any{"type": "stream", "entries": entries, "groups": groups}
		case "zset":
			zs, _ := rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
			members := []any{}
			for _, z := range zs {
				members = append(members, []any{z.Member, strconv.FormatFloat(z.Score, 'f', -1, 64)})
			}
			out[name] = map[string]any{"type": "zset", "members": members}
		case "hash":
			h, _ := rdb.HGetAll(ctx, key).Result()
			out[name] = map[string]any{"type": "hash", "fields": h}
		case "string":
			s, _ := rdb.Get(ctx, key).Result()
			out[name] = map[string]any{"type": "string", "value": s}
		default:
			out[name] = map[string]any{"type": typ}
		}
	}
	return out
}

var newID = regexp.MustCompile(`\b[0-9]{13}-[0-9]+\b`)

// normalise makes the reply and state independent of when the case ran
// (testdata/queue/README.md): in the canonical JSON (keys sorted), stream
// ids made by the server in the event (a 13-digit time part) become
// "new:1", "new:2", … in order of first appearance, and each other 13-digit
// number v becomes "{now+d}" for the first known offset d (0, the offsets
// of the starting state, the decided delay) with base <= v-d <= end; the
// deadline error's text (deadlineText, "" for none) becomes
// "{deadline_error}".
func normalise(t *testing.T, reply any, state map[string]any, base, end int64, known map[int64]bool, deadlineText string) (any, map[string]any) {
	data, err := json.Marshal([]any{reply, state})
	if err != nil {
		t.Fatal(err)
	}
	data = []byte(casetest.Deadline(string(data), deadlineText))
	ids := map[string]string{}
	s := newID.ReplaceAllStringFunc(string(data), func(id string) string {
		if _, ok := ids[id]; !ok {
			ids[id] = fmt.Sprintf("new:%d", len(ids)+1)
		}
		return ids[id]
	})
	s = casetest.Normalise(s, base, end, known)
	var out []any
	if err := json.Unmarshal([]byte(s), &out); err != nil {
		t.Fatal(err)
	}
	return out[0], out[1].(map[string]any)
}

// strs builds an entry's fields.
func strs(kv ...string) []string { return kv }

// resolveIDs returns a copy of c with the "{now±N}" times in its entry ids
// (the jobs' and dead letters', the event's entries) resolved: a plain
// entry's id is its time.
func resolveIDs(c *queueCase, base int64, known map[int64]bool) *queueCase {
	r := *c
	entries := func(es []caseEntry) []caseEntry {
		out := slices.Clone(es)
		for i := range out {
			out[i].ID = casetest.Resolve(out[i].ID, base, known)
		}
		return out
	}
	r.State.Jobs, r.State.DLQ = entries(c.State.Jobs), entries(c.State.DLQ)
	r.Event.Entry = casetest.Resolve(c.Event.Entry, base, known)
	r.Event.Entries = slices.Clone(c.Event.Entries)
	for i, e := range r.Event.Entries {
		r.Event.Entries[i] = casetest.Resolve(e, base, known)
	}
	return &r
}

// readReply is the reply of a read event: the job a worker runs, or only
// that it is malformed (what else a reader makes of one differs by
// language).
func readReply(j queue.Job) map[string]any {
	if j.Malformed {
		return map[string]any{"malformed": true}
	}
	// Numbers as decimal text: normalise rewrites a time in the JSON text.
	n := func(v int64) string { return strconv.FormatInt(v, 10) }
	return map[string]any{"id": j.ID, "attempt": n(j.Attempt), "first_enqueued_ms": n(j.FirstEnqueuedMs),
		"payload": string(j.Payload), "type": j.Type, "last_error": j.LastError, "last_reason": j.LastReason,
		"prev_delay_ms": n(j.PrevDelayMs), "malformed": false}
}

// TestPlainCasesAgree checks that the Go reader and lib.lua's plain_job
// make the same payload of a plain entry: the read case's payload (Go's)
// is the one its 400 case dead-letters (the script's).
func TestPlainCasesAgree(t *testing.T) {
	data, err := os.ReadFile(casesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Cases []struct {
			Name   string `json:"name"`
			Expect struct {
				Reply map[string]any `json:"reply"`
				State map[string]any `json:"state"`
			} `json:"expect"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	byName := map[string]map[string]any{}
	for _, c := range f.Cases {
		byName[c.Name] = map[string]any{"reply": c.Expect.Reply, "state": c.Expect.State}
	}
	n := 0
	for name, c := range byName {
		base, ok := strings.CutSuffix(name, "/read")
		if !strings.HasPrefix(name, "plain/") || !ok || byName[base+"/400"] == nil {
			continue
		}
		job := c["reply"].(map[string]any)["job"].(map[string]any)
		dl := byName[base+"/400"]["state"].(map[string]any)["dlq"].(map[string]any)["entries"].([]any)[0].([]any)[1].([]any)
		for i := 0; i+1 < len(dl); i += 2 {
			if dl[i] == "payload" && dl[i+1] != job["payload"] {
				t.Errorf("%s: Go reads payload %q, the script dead-letters %q", base, job["payload"], dl[i+1])
			}
		}
		n++
	}
	if n < 5 {
		t.Fatalf("compared %d plain cases, want the plain/*/read cases with a 400 beside them", n)
	}
}
