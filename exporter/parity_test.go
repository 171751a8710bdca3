package exporter

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/testing/logbuf"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// parityExcluded are the series whose values differ between any two runs,
// whatever the server: the test requires them on both servers and does not
// compare their values.
var parityExcluded = map[string]string{
	"backstop_scrape_duration_seconds":        "measured by the exporter's clock",
	"backstop_stream_oldest_pending_seconds":  "an age from the entry id, which each server stamps with the time the run wrote it",
	"backstop_oldest_job_age_seconds":         "an age from first_enqueued_ms, which each server stamps with the time the run wrote it",
	"backstop_delayed_oldest_overdue_seconds": "an age from the due time, which each server stamps with the time the run wrote it",
}

// parityUnavailable are the series the embedded server cannot give: the
// test requires them from redis-server and absent, not 0, on the embedded
// server, from checkpoint `from` on ("" for every checkpoint).
var parityUnavailable = []struct{ series, from, why string }{
	{`backstop_dlq_ingested_total{queue="legacy"}`, "",
		"no XINFO STREAM entries-added, and the scripts did not write this DLQ (entries added by hand): nothing counts them"},
	{`backstop_stream_lag_jobs{group="workers",queue="orders"}`, "outcomes",
		"XINFO GROUPS gives the stream's length as the lag and no entries-read: once the group has delivered entries, the pending ones would count as undelivered"},
	{"backstop_redis_memory_used_bytes", "", "no INFO memory"},
	{"backstop_redis_memory_max_bytes", "", "no INFO memory"},
	{"backstop_redis_memory_policy_info", "", "no INFO memory"},
	{"backstop_redis_evicted_keys_total", "", "INFO stats without evicted_keys, and INFO takes one section"},
	{"backstop_redis_rejected_writes_total", "", "no INFO errorstats"},
}

// parityCheckpoints are the points of the scenario where both servers are
// scraped, in order.
var parityCheckpoints = []string{"enqueued", "outcomes", "promoted", "reclaimed", "trimmed", "replayed"}

// TestEmbeddedServerParity runs one deterministic scenario on redis-server
// and on the embedded server of `backstop demo` (miniredis, when no
// redis-server is on the PATH), scrapes the exporter over HTTP at each
// checkpoint, and requires the same value for every series, but for those
// of parityExcluded (values that differ between any two runs) and
// parityUnavailable (figures the embedded server cannot give: absent
// there, not 0). On redis-server it also proves, at every checkpoint, that
// the scripts' dead-letter count the exporter falls back on equals
// entries-added: after dead letters of every reason, crash loops, a
// trimmed DLQ and a replay.
func TestEmbeddedServerParity(t *testing.T) {
	real := parityScenario(t, redistest.Start(t).Client(), true)
	emb := parityScenario(t, redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()}), false)
	for i, cp := range parityCheckpoints {
		compareParity(t, cp, real[i], emb[i])
	}
	// The scenario produces every figure it says the embedded server
	// cannot give: on redis-server, at some checkpoint.
	for _, u := range parityUnavailable {
		found := false
		for _, snap := range real {
			for k := range snap {
				found = found || k == u.series || strings.HasPrefix(k, u.series+"{")
			}
		}
		if !found {
			t.Errorf("redis-server never gave %s: the scenario must produce it", u.series)
		}
	}
}

func compareParity(t *testing.T, cp string, real, emb map[string]float64) {
	t.Helper()
	unavailable := map[string]string{}
	for _, u := range parityUnavailable {
		if u.from == "" || slices.Index(parityCheckpoints, cp) >= slices.Index(parityCheckpoints, u.from) {
			unavailable[u.series] = u.why
		}
	}
	matches := func(k, pattern string) bool { return k == pattern || strings.HasPrefix(k, pattern+"{") }
	find := func(k string, in map[string]string) (string, bool) {
		for pattern, why := range in {
			if matches(k, pattern) {
				return why, true
			}
		}
		return "", false
	}
	for k, v := range real {
		e, ok := emb[k]
		if why, gone := find(k, unavailable); gone {
			if ok {
				t.Errorf("%s: %s = %v on the embedded server, want it absent (%s)", cp, k, e, why)
			}
			continue
		}
		switch _, excluded := find(k, parityExcluded); {
		case !ok:
			t.Errorf("%s: %s = %v on redis-server, absent on the embedded server", cp, k, v)
		case !excluded && e != v:
			t.Errorf("%s: %s = %v on redis-server, %v on the embedded server", cp, k, v, e)
		}
	}
	for k, e := range emb {
		if _, ok := real[k]; !ok {
			t.Errorf("%s: %s = %v on the embedded server, absent on redis-server", cp, k, e)
		}
	}
}

// parityScenario runs the scenario on rdb (a fresh server) and returns the
// exporter's series at each checkpoint. real says rdb is a redis-server:
// then the scripts' dead-letter count is checked against entries-added.
func parityScenario(t *testing.T, rdb *redis.Client, real bool) []map[string]float64 {
	t.Helper()
	ctx := context.Background()
	logs := &logbuf.Buffer{}
	c, err := NewCollector(rdb, WithQueues(QueueFor("orders"), QueueFor("legacy"), QueueFor("idle")),
		WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	must(t, err)
	url := serve(t, c)
	var snaps []map[string]float64
	checkpoint := func(name string) {
		t.Helper()
		if name != parityCheckpoints[len(snaps)] {
			t.Fatalf("checkpoint %s, want %s", name, parityCheckpoints[len(snaps)])
		}
		if real {
			proveIngestion(t, rdb, name, redisqueue.KeysFor("orders"))
		}
		snaps = append(snaps, scrapeAll(t, url))
	}

	q := redisqueue.New(rdb, "orders")
	must(t, q.EnsureGroup(ctx))
	must(t, redisqueue.New(rdb, "idle").EnsureGroup(ctx))
	for i := range 16 {
		_, err := q.Enqueue(ctx, fmt.Sprintf("j%02d", i), []byte(`{"n":`+strconv.Itoa(i)+`}`))
		must(t, err)
	}
	// An entry without a job id, as a producer that skips the scripts
	// writes it: the worker dead-letters it as malformed.
	must(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.Keys().Jobs, Values: []string{"payload", "no id"}}).Err())
	// Dead letters written by another tool: only entries-added counts them.
	for range 2 {
		must(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: redisqueue.KeysFor("legacy").DLQ, Values: []string{"reason", "by_hand"}}).Err())
	}
	checkpoint("enqueued")

	m := readGroup(t, rdb, q.Keys().Jobs, "workers", 14) // j00..j13
	for _, e := range m[:3] {
		ack(t, q, e.ID)
	}
	retry(t, q, m[3].ID, 0, "transient")
	retry(t, q, m[4].ID, 0, "retry_after")
	retry(t, q, m[5].ID, 0, "uncertain")
	retry(t, q, m[6].ID, time.Hour, "transient") // stays delayed, not due
	deadLetter(t, q, m[7].ID, "permanent_error")
	deadLetter(t, q, m[8].ID, "max_attempts_reached")
	deadLetter(t, q, m[9].ID, "not_idempotent")
	// j10..j13 stay pending: crashed consumers, for reclaim.
	checkpoint("outcomes")

	if n, _, err := q.Promote(ctx, 100); err != nil || n != 3 {
		t.Fatalf("promote: %d, %v", n, err)
	}
	m = readGroup(t, rdb, q.Keys().Jobs, "workers", 6) // j14, j15, the malformed entry, then j03..j05 at attempt 2
	if m[2].Values["id"] != nil || m[3].Values["attempt"] != "2" {
		t.Fatalf("unexpected entries: %v", m)
	}
	ack(t, q, m[0].ID)
	deadLetter(t, q, m[1].ID, "max_elapsed_exceeded")
	deadLetter(t, q, m[2].ID, "malformed")
	ack(t, q, m[3].ID)                   // a success on attempt 2
	retry(t, q, m[4].ID, 0, "transient") // attempt 3 waits, overdue
	deadLetter(t, q, m[5].ID, "uncertain_limit_reached")
	checkpoint("promoted")

	// No entry has been idle for an hour: XPENDING IDLE takes none.
	if r := reclaim(t, q, "w0", time.Hour, 100, 2); r.DeadLettered != 0 || len(r.Jobs) != 0 {
		t.Fatalf("reclaim of entries idle for an hour: %+v", r)
	}
	pending, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: q.Keys().Jobs, Group: "workers", Start: "-", End: "+", Count: 10}).Result()
	must(t, err)
	if len(pending) != 4 {
		t.Fatalf("pending: %+v, want j10..j13", pending)
	}
	// j13's data is deleted by hand while it is pending: reclaim acks it.
	must(t, rdb.XDel(ctx, q.Keys().Jobs, pending[3].ID).Err())
	if r := reclaim(t, q, "w2", 0, 100, 2); r.DeadLettered != 0 || len(r.Jobs) != 3 {
		t.Fatalf("reclaim: %+v, want j10..j12 claimed", r)
	}
	// Delivered twice now: j10 and j11 are crash loops; j12 stays pending.
	if r := reclaim(t, q, "w3", 0, 2, 2); r.DeadLettered != 2 || len(r.Jobs) != 0 {
		t.Fatalf("reclaim: %+v, want 2 crash loops", r)
	}
	checkpoint("reclaimed")

	// 8 dead letters; trimming keeps the newest 5.
	must(t, rdb.XTrimMaxLen(ctx, q.Keys().DLQ, 5).Err())
	checkpoint("trimmed")

	// Replays j15, j05 and j10 (the malformed dead letter has no job id and
	// stays); one fails for good again, one succeeds, one waits.
	if n, err := q.Replay(ctx, 3, ""); err != nil || n != 3 {
		t.Fatalf("replay: %d, %v", n, err)
	}
	m = readGroup(t, rdb, q.Keys().Jobs, "workers", 2)
	deadLetter(t, q, m[0].ID, "permanent_error")
	ack(t, q, m[1].ID)
	checkpoint("replayed")

	if logs.String() != "" {
		t.Errorf("exporter logs:\n%s", logs)
	}
	return snaps
}

// reclaim calls q.Reclaim and fails the test on an error.
func reclaim(t *testing.T, q *redisqueue.Queue, consumer string, minIdle time.Duration, count, maxDeliveries int) redisqueue.Reclaimed {
	t.Helper()
	r, err := q.Reclaim(context.Background(), consumer, minIdle, count, maxDeliveries)
	must(t, err)
	return r
}

// proveIngestion checks, on redis-server, that the count the exporter
// falls back on where a server does not report entries-added, the stats
// field attempts:dead_letter, equals the DLQ's entries-added, and so does
// the sum of the dead_letters:<reason> fields.
func proveIngestion(t *testing.T, rdb *redis.Client, cp string, keys redisqueue.Keys) {
	t.Helper()
	ctx := context.Background()
	added := int64(0)
	v, err := rdb.Do(ctx, "XINFO", "STREAM", keys.DLQ).Result()
	if err == nil {
		var ok bool
		if added, ok = replyInt(fieldsOf(v), "entries-added"); !ok {
			t.Fatalf("%s: redis-server's XINFO STREAM has no entries-added: %v", cp, v)
		}
	} else if !isMissing(err) {
		t.Fatal(err)
	}
	stats, err := rdb.HGetAll(ctx, keys.Stats).Result()
	must(t, err)
	count, _ := strconv.ParseInt(stats[scriptDeadLetters], 10, 64)
	var reasons int64
	for k, v := range stats {
		if strings.HasPrefix(k, "dead_letters:") {
			n, _ := strconv.ParseInt(v, 10, 64)
			reasons += n
		}
	}
	if count != added || reasons != added {
		t.Errorf("%s: entries-added %d, stats %s %d, sum of dead_letters:* %d: want them equal", cp, added, scriptDeadLetters, count, reasons)
	}
}

var nodeLabel = regexp.MustCompile(`node="[^"]*"`)

// scrapeAll GETs url and returns every series of the text exposition,
// histograms as their _bucket, _sum and _count series, with the node label
// (the server's address) replaced by "N".
func scrapeAll(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	must(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	must(t, err)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, body)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("exposition does not parse: %v\n%s", err, body)
	}
	out := map[string]float64{}
	for name, mf := range mfs {
		if strings.HasPrefix(name, "go_") {
			continue // the Go runtime's collector, beside the exporter's
		}
		for _, m := range mf.GetMetric() {
			labels := labelPairs(m.GetLabel())
			put := func(name string, labels []string, v float64) {
				out[nodeLabel.ReplaceAllString(series(name, labels), `node="N"`)] = v
			}
			switch mf.GetType() {
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				put(name+"_count", labels, float64(h.GetSampleCount()))
				put(name+"_sum", labels, h.GetSampleSum())
				for _, b := range h.GetBucket() {
					le := append(slices.Clone(labels), `le="`+strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)+`"`)
					put(name+"_bucket", le, float64(b.GetCumulativeCount()))
				}
			case dto.MetricType_COUNTER:
				put(name, labels, m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				put(name, labels, m.GetGauge().GetValue())
			default:
				put(name, labels, m.GetUntyped().GetValue())
			}
		}
	}
	return out
}
