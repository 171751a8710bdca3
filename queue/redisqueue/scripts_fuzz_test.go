package redisqueue_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// The fuzz targets run the contract's scripts on fuzzed inputs against a
// real redis-server, one per fuzzing process, emptied before each input:
//
//   - FuzzScriptEntries: a stream entry (its fields, and up to 4999 more)
//     meets ack, retry, dead_letter and reclaim;
//   - FuzzScriptMembers: a delayed set member meets promote;
//   - FuzzScriptArgs: one ARGV of any script is replaced.
//
// Each can also damage a key first (a counter holding a fuzzed value or at
// its maximum, a key of the wrong type, a stream without ids left, two KEYS
// that are one key, an entry whose data was deleted). The contract checked:
// a script refuses with "ERR backstop <script>: ..." (or Redis' NOGROUP)
// and writes nothing, or it moves jobs whole, none lost or duplicated, the
// counters in step, and a dead letter or a promoted member keeps every
// byte. `make fuzz` runs them; `go test` runs their seeds.

// scriptInput is one fuzzed case.
type scriptInput struct {
	op     int    // index in scriptNames
	entry  string // fields of the first entry, NUL-separated ("" for a well-formed job)
	wide   int    // more fields for it, f<i> v<i>
	member string // a due member of the delayed set ("" for none)
	argi   int    // the ARGV to replace with arg (out of range: none)
	arg    string
	damage int // see damage
	value  string
}

var scriptNames = []string{"enqueue", "ack", "retry", "dead_letter", "promote", "reclaim", "replay", "defer"}

// The counters the scripts write, for damage to pick from.
var counterFields = []string{"enqueued", "attempts:success", "finished:success:1", "finished_sum:success", "attempts:retry",
	"retries:transient", "attempts:dead_letter", "dead_letters:r", "dead_letters:crash_loop", "finished:dead_letter:1",
	"finished_sum:dead_letter", "max_attempts_reached", "promoted", "reclaimed", "reclaim_skipped", "replayed",
	"attempts:deferred", "deferred:circuit_open"}

func FuzzScriptEntries(f *testing.F) {
	h := newScriptHarness(f)
	f.Add(uint8(5), "", uint16(4000), uint8(0), "")                               // item 4: no id, 4,000 fields, a crash loop
	f.Add(uint8(3), "", uint16(4000), uint8(0), "")                               // ... dead-lettered
	f.Add(uint8(3), "id\x00a\x00id\x00b\x00x\x00\xff", uint16(0), uint8(0), "")   // duplicate names, a byte that is not UTF-8
	f.Add(uint8(2), "id\x00j\x00attempt\x001e300", uint16(0), uint8(0), "")       // a malformed attempt
	f.Add(uint8(2), "", uint16(0), uint8(3+8*3), "")                              // item 3: stats of the wrong type
	f.Add(uint8(1), "", uint16(0), uint8(2+8*3), "x")                             // the last counter not an integer
	f.Add(uint8(3), "", uint16(0), uint8(6+8*11), "")                             // max_attempts_reached at its maximum
	f.Add(uint8(5), "", uint16(0), uint8(3+8*2), "")                              // a dlq of the wrong type: skipped
	f.Add(uint8(5), "id\x00j", uint16(0), uint8(4+8*1), "")                       // a dlq without ids left
	f.Add(uint8(2), "", uint16(0), uint8(5+8*6), "")                              // delayed and stats one key
	f.Add(uint8(5), "", uint16(0), uint8(7), "")                                  // the entry's data deleted
	f.Add(uint8(1), "attempt\x0099999999999999999999", uint16(0), uint8(0), "")   // a huge attempt, counted capped
	f.Add(uint8(3), "type\x00a:b\x00type\x00send_email", uint16(0), uint8(0), "") // a job type given twice, kept
	f.Add(uint8(5), "type\x00\xff", uint16(0), uint8(0), "")                      // a crash loop of a type that is not valid
	f.Fuzz(func(t *testing.T, op uint8, entry string, wide uint16, damage uint8, value string) {
		ops := []int{1, 2, 3, 5, 7}
		h.exercise(t, scriptInput{op: ops[int(op)%len(ops)], entry: entry, wide: int(wide) % 5000, argi: -1,
			damage: int(damage), value: value})
	})
}

func FuzzScriptMembers(f *testing.F) {
	h := newScriptHarness(f)
	const base = `"id":"j","attempt":2,"first_enqueued_ms":"1700000000000"`
	for _, m := range []string{
		// item 6, and what retry.lua writes
		`{` + base + `,"payload":{"a":1}}`, `{` + base + `,"payload":12345678901234567890}`,
		`{` + base + `,"payload":"p","prev_delay_ms":1e300}`, `{"id":"j","attempt":2.0000000000000001}`,
		`{"id":"j","id":"k","attempt":2}`, `{"id":"\ud800"}`, `not json`, `[1]`, `{"id":"j","attempt":0x10}`,
		`{"last_reason":"transient","prev_delay_ms":25,"last_error":"e","payload":"p\u0000\u00e9\/","id":"j","source":"1-1","attempt":2,"first_enqueued_ms":"1"}`,
		`{` + base + `,"type":"send_email"}`, `{` + base + `,"type":7}`, `{` + base + `,"type":"a","type":"b"}`,
	} {
		f.Add(m, uint8(0), "")
	}
	f.Add(`{"id":"j","attempt":2}`, uint8(2+8*12), "1.5") // promoted not an integer
	f.Add(`{"id":"j","attempt":2}`, uint8(4), "")         // a jobs stream without ids left
	f.Fuzz(func(t *testing.T, member string, damage uint8, value string) {
		h.exercise(t, scriptInput{op: 4, member: member, argi: -1, damage: int(damage), value: value})
	})
}

func FuzzScriptArgs(f *testing.F) {
	h := newScriptHarness(f)
	for _, c := range []struct {
		op, argi int
		arg      string
	}{
		{1, 1, "$ms"}, {2, 1, "$ms"}, {3, 1, "$ms"}, {1, 1, "+"}, {1, 1, "($e"}, {1, 1, "0$e"}, {2, 1, "0-1"}, {3, 1, "-"}, // item 7
		{1, 0, ""}, {1, 0, "nogroup"},
		{2, 2, "0x10"}, {2, 2, "1e3"}, {2, 2, "inf"}, {2, 3, "Transient"}, {3, 2, "two words"}, {3, 2, "\xff"},
		{4, 0, " 5"}, {4, 0, "nan"}, {5, 2, "inf"}, {5, 4, "inf"}, {5, 3, "1001"}, {5, 1, ""},
		{6, 2, "5000"}, {6, 2, "+"}, {6, 3, "15.5"}, {6, 1, "r"}, {6, 1, "a b"}, {0, 0, ""}, {0, 1, "\x00\xff"},
		{7, 1, "$ms"}, {7, 2, "1e3"}, {7, 3, "transient"}, {7, 3, ""},
	} {
		f.Add(uint8(c.op), uint8(c.argi), c.arg, uint8(0))
	}
	f.Add(uint8(1), uint8(9), "", uint8(6+8*1)) // attempts:success at its maximum
	f.Fuzz(func(t *testing.T, op, argi uint8, arg string, damage uint8) {
		h.exercise(t, scriptInput{op: int(op) % len(scriptNames), argi: int(argi), arg: arg, damage: int(damage),
			member: `{"id":"m","attempt":2,"first_enqueued_ms":"1"}`})
	})
}

type scriptHarness struct {
	rdb     *redis.Client
	scripts map[string]*redis.Script
}

func newScriptHarness(f *testing.F) *scriptHarness {
	h := &scriptHarness{rdb: redistest.Start(f).Client(), scripts: map[string]*redis.Script{}}
	for _, n := range scriptNames {
		h.scripts[n] = script(f, n)
	}
	return h
}

// state is what the checks compare: raw entries, sizes, counters; -1 for
// a size a damaged key cannot give.
type state struct {
	jobs, dlq         [][]string
	nJobs, nDLQ       int64
	pending, nDelayed int64
	counters          map[string]string
}

func (h *scriptHarness) state(ctx context.Context, k redisqueue.Keys) state {
	s := state{nJobs: -1, nDLQ: -1, pending: -1, nDelayed: -1}
	entries := func(key string) ([][]string, int64) {
		v, err := h.rdb.Do(ctx, "XRANGE", key, "-", "+").Slice()
		if err != nil {
			return nil, -1
		}
		var out [][]string
		for _, e := range v {
			e := e.([]any)
			row := []string{e[0].(string)}
			for _, f := range e[1].([]any) {
				row = append(row, f.(string))
			}
			out = append(out, row)
		}
		return out, int64(len(out))
	}
	s.jobs, s.nJobs = entries(k.Jobs)
	s.dlq, s.nDLQ = entries(k.DLQ)
	if p, err := h.rdb.XPending(ctx, k.Jobs, "workers").Result(); err == nil {
		s.pending = p.Count
	}
	if n, err := h.rdb.ZCard(ctx, k.Delayed).Result(); err == nil {
		s.nDelayed = n
	}
	s.counters, _ = h.rdb.HGetAll(ctx, k.Stats).Result()
	return s
}

func (s state) counter(f string) int64 {
	n, _ := strconv.ParseInt(s.counters[f], 10, 64)
	return n
}

func (h *scriptHarness) exercise(t *testing.T, in scriptInput) {
	ctx := context.Background()
	rdb := h.rdb
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	q := redisqueue.New(rdb, "f")
	k := q.Keys()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(rdb.XGroupCreateMkStream(ctx, k.Jobs, "workers", "0").Err())
	fields := []string{"id", "j1", "attempt", "1", "first_enqueued_ms", "1", "payload", "p1"}
	if in.entry != "" {
		fields = strings.Split(in.entry, "\x00")
		if len(fields)%2 == 1 {
			fields = append(fields, "")
		}
	}
	for i := range in.wide {
		fields = append(fields, "f"+strconv.Itoa(i), "v"+strconv.Itoa(i))
	}
	// A sequence number that is not 0: "5000" then names more than e1.
	e1, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: k.Jobs, ID: "5000-1", Values: fields}).Result()
	must(err)
	rdb.XAdd(ctx, &redis.XAddArgs{Stream: k.Jobs, Values: []string{"id", "j2", "attempt", "1", "first_enqueued_ms", "1", "payload", "p2"}})
	must(rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "workers", Consumer: "c1", Streams: []string{k.Jobs, ">"}, Block: -1}).Err())
	// e1 is on its second delivery: a crash loop for reclaim (max 2).
	must(rdb.XClaim(ctx, &redis.XClaimArgs{Stream: k.Jobs, Group: "workers", Consumer: "c1", Messages: []string{e1}}).Err())
	if in.member != "" {
		must(rdb.ZAdd(ctx, k.Delayed, redis.Z{Score: 0, Member: in.member}).Err())
	}
	must(rdb.XAdd(ctx, &redis.XAddArgs{Stream: k.DLQ, Values: []string{"reason", "r", "id", "d1", "payload", "pd"}}).Err())
	must(rdb.HSet(ctx, k.Stats, "enqueued", 2).Err())

	name := scriptNames[in.op]
	keys := map[string][]string{
		"enqueue": {k.Jobs, k.Stats}, "ack": {k.Jobs, k.Stats}, "retry": {k.Jobs, k.Delayed, k.Stats},
		"dead_letter": {k.Jobs, k.DLQ, k.Stats}, "promote": {k.Delayed, k.Jobs, k.Stats},
		"reclaim": {k.Jobs, k.DLQ, k.Stats}, "replay": {k.DLQ, k.Jobs, k.Stats}, "defer": {k.Jobs, k.Delayed, k.Stats},
	}[name]
	args := map[string][]any{
		"enqueue": {"j9", in.value}, "ack": {"workers", e1}, "retry": {"workers", e1, "0", "transient", in.value},
		"dead_letter": {"workers", e1, "r", in.value}, "promote": {"100"}, "reclaim": {"workers", "c2", "0", "100", "2"},
		"replay": {"100", "", "-", "1000"}, "defer": {"workers", e1, "0", "circuit_open", in.value},
	}[name]
	if in.argi >= 0 && in.argi < len(args) {
		// $e stands for the first entry's id, $ms for its time alone.
		ms, _, _ := strings.Cut(e1, "-")
		args[in.argi] = strings.NewReplacer("$e", e1, "$ms", ms).Replace(in.arg)
	}
	all := []string{k.Jobs, k.Delayed, k.DLQ, k.Stats}
	pick := in.damage / 8
	switch in.damage % 8 {
	case 2:
		must(rdb.HSet(ctx, k.Stats, counterFields[pick%len(counterFields)], in.value).Err())
	case 3:
		key := all[pick%len(all)]
		rdb.Del(ctx, key)
		must(rdb.Set(ctx, key, "legacy", 0).Err())
	case 4:
		must(rdb.XAdd(ctx, &redis.XAddArgs{Stream: []string{k.Jobs, k.DLQ}[pick%2], ID: "18446744073709551615-18446744073709551615", Values: []string{"f", "v"}}).Err())
	case 5:
		keys = slices.Clone(keys)
		i, j := pick%len(keys), (pick/len(keys))%len(keys)
		keys[i] = keys[j]
	case 6:
		must(rdb.HSet(ctx, k.Stats, counterFields[pick%len(counterFields)], "9223372036854775807").Err())
	case 7:
		must(rdb.XDel(ctx, k.Jobs, e1).Err())
	}

	before, sb := snapshot(t, ctx, rdb), h.state(ctx, k)
	reply, err := h.scripts[name].Run(ctx, rdb, keys, args...).Result()
	after, sa := snapshot(t, ctx, rdb), h.state(ctx, k)
	if err != nil {
		if msg := err.Error(); !strings.HasPrefix(msg, "ERR backstop "+name+": ") && !strings.HasPrefix(msg, "NOGROUP ") {
			t.Fatalf("%s%q: unexpected error %v", name, args, err)
		}
		if !maps.Equal(before, after) {
			t.Fatalf("%s%q refused (%v), yet it wrote", name, args, err)
		}
		return
	}
	// What moved: deltas of the sizes and of the counters.
	dJobs, dPending, dDelayed, dDLQ := sa.nJobs-sb.nJobs, sa.pending-sb.pending, sa.nDelayed-sb.nDelayed, sa.nDLQ-sb.nDLQ
	dCounter := func(f string) int64 { return sa.counter(f) - sb.counter(f) }
	fail := func(format string, a ...any) {
		t.Helper()
		t.Fatalf("%s%q -> %v: %s", name, args, reply, fmt.Sprintf(format, a...))
	}
	unchanged := func() {
		t.Helper()
		if !maps.Equal(before, after) {
			fail("nothing to do, yet it wrote")
		}
	}
	hadData := int64(0) // the entry's data was there to delete
	if sb.nJobs >= 0 && slices.ContainsFunc(sb.jobs, func(r []string) bool { return r[0] == e1 }) {
		hadData = 1
	}
	switch name {
	case "enqueue":
		if dJobs != 1 || dCounter("enqueued") != 1 {
			fail("jobs %+d, enqueued %+d", dJobs, dCounter("enqueued"))
		}
	case "ack":
		if reply == int64(0) {
			unchanged()
		} else if dJobs != -hadData || dPending != -1 || dCounter("attempts:success") != 1 {
			fail("jobs %+d pending %+d success %+d", dJobs, dPending, dCounter("attempts:success"))
		}
	case "retry":
		if reply == int64(0) {
			unchanged()
		} else if dJobs != -1 || dPending != -1 || dDelayed != 1 || dCounter("attempts:retry") != 1 {
			fail("jobs %+d pending %+d delayed %+d retry %+d", dJobs, dPending, dDelayed, dCounter("attempts:retry"))
		}
	case "defer":
		// As a retry, but counted apart and without spending an attempt.
		if reply == int64(0) {
			unchanged()
		} else if dJobs != -1 || dPending != -1 || dDelayed != 1 || dCounter("attempts:deferred") != 1 || dCounter("attempts:retry") != 0 {
			fail("jobs %+d pending %+d delayed %+d deferred %+d retry %+d", dJobs, dPending, dDelayed, dCounter("attempts:deferred"), dCounter("attempts:retry"))
		}
	case "dead_letter":
		if reply == int64(0) {
			unchanged()
			return
		}
		if dJobs != -1 || dPending != -1 || dDLQ != 1 || dCounter("attempts:dead_letter") != 1 {
			fail("jobs %+d pending %+d dlq %+d dead_letter %+d", dJobs, dPending, dDLQ, dCounter("attempts:dead_letter"))
		}
		h.checkDeadLetters(t, sb, sa)
	case "promote":
		v, _ := reply.([]any)
		if len(v) != 2 {
			fail("want {moved, next}")
		}
		moved, _ := v[0].(int64)
		if dDelayed != -moved || dJobs != moved || dCounter("promoted") != moved {
			fail("delayed %+d jobs %+d promoted %+d", dDelayed, dJobs, dCounter("promoted"))
		}
		if moved == 1 {
			checkPromoted(t, in.member, sa.jobs[len(sa.jobs)-1][1:])
		}
	case "reclaim":
		v, _ := reply.([]any)
		if len(v) != 3 {
			fail("want {dead, claimed, skipped}")
		}
		d, _ := v[0].(int64)
		c, _ := v[1].([]any)
		s, _ := v[2].([]any)
		dead, claimed, skipped := d, int64(len(c)), int64(len(s))
		if dDLQ != dead || dJobs != -dead || dCounter("attempts:dead_letter") != dead || dCounter("dead_letters:crash_loop") != dead ||
			dCounter("reclaimed") != claimed || dCounter("reclaim_skipped") != skipped || (dPending != -dead && dPending != -dead-(1-hadData)) {
			fail("dlq %+d jobs %+d pending %+d dead_letter %+d reclaimed %+d skipped %+d", dDLQ, dJobs, dPending,
				dCounter("attempts:dead_letter"), dCounter("reclaimed"), dCounter("reclaim_skipped"))
		}
		// With the default ARGV every pending entry is idle long enough.
		if in.argi >= len(args) && (dead+claimed+skipped+(1-hadData) != sb.pending || dPending != -dead-(1-hadData)) {
			fail("%d dead, %d claimed, %d skipped of %d pending", dead, claimed, skipped, sb.pending)
		}
		h.checkDeadLetters(t, sb, sa)
	case "replay":
		v, _ := reply.([]any)
		if len(v) != 2 {
			fail("want {moved, cursor}")
		}
		moved, _ := v[0].(int64)
		if dDLQ != -moved || dJobs != moved || dCounter("replayed") != moved {
			fail("dlq %+d jobs %+d replayed %+d", dDLQ, dJobs, dCounter("replayed"))
		}
	}
}

// checkDeadLetters checks that every new dead letter keeps every field of
// the entry it came from, byte for byte.
func (h *scriptHarness) checkDeadLetters(t *testing.T, sb, sa state) {
	t.Helper()
	old := map[string]bool{}
	for _, r := range sb.dlq {
		old[r[0]] = true
	}
	src := map[string][]string{}
	for _, r := range sb.jobs {
		src[r[0]] = r[1:]
	}
	for _, r := range sa.dlq {
		if old[r[0]] {
			continue
		}
		dl := r[1:]
		got := map[string]string{}
		var kept []string
		for i := 0; i+1 < len(dl); i += 2 {
			if name, ok := strings.CutPrefix(dl[i], "entry."); ok {
				kept = append(kept, name, dl[i+1])
			} else {
				got[dl[i]] = dl[i+1]
			}
		}
		fields, ok := src[got["source_id"]]
		if !ok {
			t.Fatalf("dead letter %v: no source entry", r)
		}
		if got["entry_fields"] != "" {
			if kept != nil {
				t.Fatalf("dead letter %v: entry_fields and entry.*", r)
			}
			var err error
			kept, err = h.rdb.Eval(context.Background(), "return cjson.decode(ARGV[1])", nil, got["entry_fields"]).StringSlice()
			if err != nil {
				t.Fatal(err)
			}
		}
		last := map[string]int{}
		for i := 0; i+1 < len(fields); i += 2 {
			last[fields[i]] = i
		}
		var want []string
		for i := 0; i+1 < len(fields); i += 2 {
			switch n := fields[i]; {
			case (n == "id" || n == "attempt" || n == "first_enqueued_ms" || n == "payload" || n == "type") && last[n] == i:
				if got[n] != fields[i+1] {
					t.Fatalf("dead letter %v: %s is %q, the entry's %q", r, n, got[n], fields[i+1])
				}
			default:
				want = append(want, n, fields[i+1])
			}
		}
		if !slices.Equal(kept, want) {
			t.Fatalf("dead letter of %v keeps %q, want %q", fields, kept, want)
		}
	}
}

// checkPromoted checks that member reached the stream raw or as the job it
// describes, losing nothing.
func checkPromoted(t *testing.T, member string, fields []string) {
	t.Helper()
	if len(fields) == 2 && fields[0] == "malformed_delayed_member" {
		if fields[1] != member {
			t.Fatalf("member %q moved raw as %q", member, fields[1])
		}
		return
	}
	if !utf8.ValidString(member) {
		return // encoding/json would read its strings differently from cjson
	}
	d := json.NewDecoder(bytes.NewReader([]byte(member)))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		return // cjson reads it, encoding/json does not: the bytes moved as they were
	}
	got := map[string]string{}
	for i := 0; i+1 < len(fields); i += 2 {
		got[fields[i]] = fields[i+1]
	}
	for _, f := range []string{"id", "attempt", "first_enqueued_ms", "payload", "last_error", "last_reason", "prev_delay_ms", "type"} {
		want := ""
		switch v := m[f].(type) {
		case string:
			want = v
		case json.Number:
			want = v.String()
		case nil:
			if f == "prev_delay_ms" {
				want = "0"
			}
		default:
			t.Fatalf("member %q: %s of type %T moved as a job", member, f, v)
		}
		if got[f] != want {
			t.Fatalf("member %q moved with %s %q, want %q", member, f, got[f], want)
		}
	}
	for f := range m {
		if !slices.Contains([]string{"id", "attempt", "first_enqueued_ms", "payload", "last_error", "last_reason", "prev_delay_ms", "source", "type"}, f) {
			t.Fatalf("member %q moved as a job, dropping %s", member, f)
		}
	}
}
