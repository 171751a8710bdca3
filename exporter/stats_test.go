package exporter

import (
	"context"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// TestStatsLabelsBounded gives one queue's stats hash more reasons and
// outcomes than the exporter reports: it reports the first
// maxStatsLabels of each, sorted, and says it reached the limit; the
// other queue is reported whole.
func TestStatsLabelsBounded(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	fields := []any{"enqueued", 1}
	for i := range 3 * maxStatsLabels {
		r := "r" + strconv.Itoa(1000+i) // sorts as numbered
		fields = append(fields, "retries:"+r, 1, "dead_letters:"+r, 1, "attempts:"+r, 1, "finished:"+r+":1", 1)
	}
	must(t, rdb.HSet(ctx, QueueFor("noisy").Keys.Stats, fields...).Err())
	must(t, rdb.HSet(ctx, QueueFor("calm").Keys.Stats, "retries:transient", 2, "attempts:retry", 2, "retries:bad\xff", 1, "retries:new\nline", 1).Err())

	c, _ := newTestCollector(t, rdb, WithQueues(QueueFor("noisy"), QueueFor("calm")))
	got := gather(t, c)
	count := func(prefix string) int {
		n := 0
		for k := range got {
			if len(k) > len(prefix) && k[:len(prefix)] == prefix {
				n++
			}
		}
		return n
	}
	for prefix, n := range map[string]int{
		"backstop_retries_total{job_type=\"\",queue=\"noisy\"":      maxStatsLabels,
		"backstop_dead_letters_total{job_type=\"\",queue=\"noisy\"": maxStatsLabels,
		"backstop_attempts_total{":                                  maxStatsLabels + 3, // noisy: success, retry, dead_letter and 61 more; calm: 3
		"backstop_job_attempts_count{":                              maxStatsLabels,
		"backstop_retries_total{job_type=\"\",queue=\"calm\"":       1, // not the invalid label values
	} {
		if c := count(prefix); c != n {
			t.Errorf("%d series %s…, want %d", c, prefix, n)
		}
	}
	want(t, got, map[string]float64{
		`backstop_scrape_limit_reached{limit="stats_labels"}`:                  1,
		`backstop_retries_total{job_type="",queue="noisy",reason="r1000"}`:     1,
		`backstop_attempts_total{job_type="",outcome="success",queue="noisy"}`: 0, // known outcomes stay
		`backstop_attempts_total{job_type="",outcome="r1060",queue="noisy"}`:   1,
		`backstop_retries_total{job_type="",queue="calm",reason="transient"}`:  2,
		`backstop_attempts_total{job_type="",outcome="success",queue="calm"}`:  0,
		`backstop_enqueued_total{queue="noisy"}`:                               1,
	}, `backstop_retries_total{job_type="",queue="noisy",reason="r1064"}`, `backstop_attempts_total{job_type="",outcome="r1061",queue="noisy"}`)
}

// Reclaim counts the crash loops the DLQ refused in reclaim_skipped; the
// exporter skipped that field, so a crash loop stuck in a queue (pending,
// never dead-lettered) showed nowhere. It is backstop_reclaim_skipped_total.
func TestReclaimSkippedIsExported(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "loopy")
	must(t, q.EnsureGroup(ctx))
	_, err := q.Enqueue(ctx, "loop", []byte("x"))
	must(t, err)
	m := readGroup(t, rdb, q.Keys().Jobs, q.Group(), 1)
	// Delivered twice, the reclaim limit: a crash loop.
	must(t, rdb.Do(ctx, "XCLAIM", q.Keys().Jobs, q.Group(), "c", 0, m[0].ID, "RETRYCOUNT", 2).Err())
	must(t, rdb.Set(ctx, q.Keys().DLQ, "legacy", 0).Err()) // a DLQ that refuses it
	for range 3 {
		r, err := q.Reclaim(ctx, "c2", 0, 10, 2)
		if err != nil || len(r.Skipped) != 1 || r.DeadLettered != 0 {
			t.Fatalf("reclaim: %+v %v", r, err)
		}
	}
	must(t, rdb.HSet(ctx, QueueFor("fine").Keys.Stats, "enqueued", 1).Err())

	c, _ := newTestCollector(t, rdb, WithQueues(QueueFor("loopy"), QueueFor("fine")))
	want(t, gather(t, c), map[string]float64{
		`backstop_reclaim_skipped_total{queue="loopy"}`: 3,
		`backstop_reclaim_skipped_total{queue="fine"}`:  0, // reported once a queue has stats, as the other counters
		`backstop_reclaimed_total{queue="loopy"}`:       0,
	})
}

// typedStats is a stats hash as the scripts leave it (queue/redisqueue/README.md,
// "Counters") after three job types and untyped jobs ran: charge_card
// fails (retries, then dead letters at max attempts), send_email and
// render_report succeed; two events of an unregistered type went to
// "other". The queue totals count every job, typed or not.
var typedStats = []any{
	"enqueued", 60,
	"attempts:success", 30, "attempts:retry", 25, "attempts:dead_letter", 6,
	"retries:transient", 25, "dead_letters:max_attempts_reached", 5, "dead_letters:permanent_error", 1,
	"max_attempts_reached", 5,
	"finished:success:1", 20, "finished:success:3", 10, "finished_sum:success", 50,
	"finished:dead_letter:5", 6, "finished_sum:dead_letter", 30,
	"types", 3, "types:known:send_email", 1, "types:known:charge_card", 1, "types:known:render_report", 1, "types:overflow", 2,
	"t:send_email:attempts:success", 10, "t:send_email:finished:success:1", 10, "t:send_email:finished_sum:success", 10,
	"t:charge_card:attempts:success", 2, "t:charge_card:attempts:retry", 20, "t:charge_card:attempts:dead_letter", 5,
	"t:charge_card:retries:transient", 20, "t:charge_card:dead_letters:max_attempts_reached", 5, "t:charge_card:max_attempts_reached", 5,
	"t:charge_card:finished:success:3", 2, "t:charge_card:finished_sum:success", 6,
	"t:charge_card:finished:dead_letter:5", 5, "t:charge_card:finished_sum:dead_letter", 25,
	"t:render_report:attempts:success", 8, "t:render_report:finished:success:1", 8, "t:render_report:finished_sum:success", 8,
	"t:other:attempts:success", 2, "t:other:attempts:retry", 1, "t:other:retries:transient", 1,
	// Not counters the exporter knows: skipped.
	"t:bad:attempts", 1, "t::attempts:success", 1, "t:bin\xff:attempts:success", 1,
}

// TestJobTypes reads a stats hash with three job types, one failing: each
// type has its series, the failing one stands out, the untyped rest has
// job_type="", and every sum by queue is the queue's total.
func TestJobTypes(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	must(t, rdb.HSet(ctx, QueueFor("shop").Keys.Stats, typedStats...).Err())
	must(t, rdb.HSet(ctx, QueueFor("plain").Keys.Stats, "attempts:success", 4, "retries:transient", 1).Err())
	c, logs := newTestCollector(t, rdb, WithQueues(QueueFor("shop"), QueueFor("plain")))
	got := gather(t, c)
	want(t, got, map[string]float64{
		`backstop_attempts_total{job_type="charge_card",outcome="retry",queue="shop"}`:                   20,
		`backstop_attempts_total{job_type="send_email",outcome="retry",queue="shop"}`:                    0,
		`backstop_attempts_total{job_type="render_report",outcome="success",queue="shop"}`:               8,
		`backstop_attempts_total{job_type="other",outcome="retry",queue="shop"}`:                         1,
		`backstop_attempts_total{job_type="",outcome="success",queue="shop"}`:                            8, // 30 - 10 - 2 - 8 - 2
		`backstop_attempts_total{job_type="",outcome="retry",queue="shop"}`:                              4,
		`backstop_attempts_total{job_type="",outcome="dead_letter",queue="shop"}`:                        1,
		`backstop_retries_total{job_type="charge_card",queue="shop",reason="transient"}`:                 20,
		`backstop_retries_total{job_type="",queue="shop",reason="transient"}`:                            4,
		`backstop_dead_letters_total{job_type="charge_card",queue="shop",reason="max_attempts_reached"}`: 5,
		`backstop_dead_letters_total{job_type="",queue="shop",reason="max_attempts_reached"}`:            0,
		`backstop_dead_letters_total{job_type="",queue="shop",reason="permanent_error"}`:                 1,
		`backstop_max_attempts_reached_total{job_type="charge_card",queue="shop"}`:                       5,
		`backstop_max_attempts_reached_total{job_type="send_email",queue="shop"}`:                        0,
		`backstop_max_attempts_reached_total{job_type="",queue="shop"}`:                                  0,
		`backstop_job_attempts_bucket{job_type="charge_card",le="3",outcome="success",queue="shop"}`:     2,
		`backstop_job_attempts_count{job_type="charge_card",outcome="dead_letter",queue="shop"}`:         5,
		`backstop_job_attempts_sum{job_type="charge_card",outcome="dead_letter",queue="shop"}`:           25,
		`backstop_job_attempts_bucket{job_type="",le="1",outcome="success",queue="shop"}`:                2, // 20 - 10 - 8
		`backstop_job_attempts_bucket{job_type="",le="3",outcome="success",queue="shop"}`:                10,
		`backstop_job_attempts_sum{job_type="",outcome="success",queue="shop"}`:                          26,
		`backstop_job_attempts_count{job_type="",outcome="dead_letter",queue="shop"}`:                    1,
		`backstop_job_types{queue="shop"}`:                                                               3,
		`backstop_job_types_overflow_total{queue="shop"}`:                                                2,
		`backstop_attempts_total{job_type="",outcome="success",queue="plain"}`:                           4,
		`backstop_scrape_errors_total{kind="stats"}`:                                                     0,
		`backstop_scrape_limit_reached{limit="job_types"}`:                                               0,
		`backstop_enqueued_total{queue="shop"}`:                                                          60,
	}, `backstop_job_types{queue="plain"}`, `backstop_job_types_overflow_total{queue="plain"}`,
		`backstop_attempts_total{job_type="bad",outcome="success",queue="shop"}`)

	// sum by (queue, <label>) over job_type is the queue's total field.
	sums := map[string]float64{}
	for k, v := range got {
		name, labels, _ := strings.Cut(k, "{")
		if !strings.Contains(labels, `queue="shop"`) || !strings.Contains(labels, "job_type=") {
			continue
		}
		var rest []string
		for _, l := range strings.Split(strings.TrimSuffix(labels, "}"), ",") {
			if !strings.HasPrefix(l, "job_type=") {
				rest = append(rest, l)
			}
		}
		sums[name+"{"+strings.Join(rest, ",")+"}"] += v
	}
	for k, v := range map[string]float64{
		`backstop_attempts_total{outcome="success",queue="shop"}`:                 30,
		`backstop_attempts_total{outcome="retry",queue="shop"}`:                   25,
		`backstop_attempts_total{outcome="dead_letter",queue="shop"}`:             6,
		`backstop_retries_total{queue="shop",reason="transient"}`:                 25,
		`backstop_dead_letters_total{queue="shop",reason="max_attempts_reached"}`: 5,
		`backstop_max_attempts_reached_total{queue="shop"}`:                       5,
		`backstop_job_attempts_count{outcome="success",queue="shop"}`:             30,
		`backstop_job_attempts_bucket{le="1",outcome="success",queue="shop"}`:     20,
		`backstop_job_attempts_sum{outcome="dead_letter",queue="shop"}`:           30,
		`backstop_job_attempts_count{outcome="dead_letter",queue="shop"}`:         6,
	} {
		if sums[k] != v {
			t.Errorf("sum over job_type of %s = %v, want the total %v", k, sums[k], v)
		}
	}
	// The typed exposition, as the handler serves it, passes promlint
	// (the checks of promtool check metrics).
	resp, err := http.Get(serve(t, c))
	must(t, err)
	defer resp.Body.Close()
	problems, err := promlint.New(resp.Body).Lint()
	must(t, err)
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	if logs.String() != "" {
		t.Errorf("logs: %s", logs)
	}
}

// A stats hash whose per-type counters exceed its totals (edited by hand,
// or by scripts of another version) gives an untyped rest of 0, never a
// negative counter, and the scrape says so.
func TestJobTypesInconsistentStats(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	must(t, rdb.HSet(ctx, QueueFor("odd").Keys.Stats, "attempts:retry", 1, "t:x:attempts:retry", 3, "t:x:retries:transient", 3, "types", 1).Err())
	c, logs := newTestCollector(t, rdb, WithQueues(QueueFor("odd")))
	want(t, gather(t, c), map[string]float64{
		`backstop_attempts_total{job_type="",outcome="retry",queue="odd"}`:   0,
		`backstop_attempts_total{job_type="x",outcome="retry",queue="odd"}`:  3,
		`backstop_retries_total{job_type="",queue="odd",reason="transient"}`: 0,
		`backstop_scrape_errors_total{kind="stats"}`:                         1,
	})
	if !strings.Contains(logs.String(), "stats hash inconsistent") || !strings.Contains(logs.String(), "queue=odd") {
		t.Errorf("logs: %s", logs)
	}
}

// However many types a queue's registry holds (types:limit has no upper
// bound), the exporter reports at most maxJobTypes by name: "other" and
// the first by name; the rest are counted into "other", so sums stay exact.
func TestJobTypesBounded(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	extra := 10
	n := maxJobTypes + extra // and other
	fields := []any{"attempts:success", n + 1, "t:other:attempts:success", 1, "types", n}
	for i := range n {
		fields = append(fields, "t:t"+strconv.Itoa(1000+i)+":attempts:success", 1)
	}
	must(t, rdb.HSet(ctx, QueueFor("wide").Keys.Stats, fields...).Err())
	c, _ := newTestCollector(t, rdb, WithQueues(QueueFor("wide")))
	got := gather(t, c)
	typed := 0
	for k := range got {
		if strings.HasPrefix(k, `backstop_attempts_total{job_type="t`) && strings.Contains(k, `outcome="success"`) {
			typed++
		}
	}
	if typed != maxJobTypes-1 {
		t.Errorf("%d types reported by name besides other, want %d", typed, maxJobTypes-1)
	}
	want(t, got, map[string]float64{
		`backstop_attempts_total{job_type="other",outcome="success",queue="wide"}`: float64(1 + extra + 1),
		`backstop_attempts_total{job_type="t1000",outcome="success",queue="wide"}`: 1,
		`backstop_attempts_total{job_type="",outcome="success",queue="wide"}`:      0,
		`backstop_scrape_limit_reached{limit="job_types"}`:                         1,
		`backstop_scrape_errors_total{kind="stats"}`:                               0,
	}, `backstop_attempts_total{job_type="t1109",outcome="success",queue="wide"}`)
}

// TestJobTypesFromScripts runs typed and untyped jobs through the real
// queue scripts (a registry of 3 types, a 4th type past it): the exporter
// names the failing type, counts the 4th as other and says the registry
// overflowed, and every sum by queue is the queue's total.
func TestJobTypesFromScripts(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "shop")
	must(t, q.EnsureGroup(ctx))
	must(t, q.SetTypeLimit(ctx, 3))
	jobs := map[string]string{ // job id → type
		"e1": "send_email", "e2": "send_email", "e3": "send_email",
		"r1": "render_report", "r2": "render_report",
		"c1": "charge_card", "c2": "charge_card", "c3": "charge_card",
		"u1": "", "u2": "", "z1": "fax", // settled last: the registry is full by then
	}
	for _, id := range slices.Sorted(maps.Keys(jobs)) {
		_, err := q.Enqueue(ctx, id, []byte("{}"), redisqueue.WithJobType(jobs[id]))
		must(t, err)
	}
	for _, m := range readGroup(t, rdb, q.Keys().Jobs, q.Group(), int64(len(jobs))) {
		switch id := m.Values["id"].(string); {
		case id == "c1":
			_, _, err := q.Retry(ctx, m.ID, time.Hour, "transient", "HTTP 503")
			must(t, err)
		case jobs[id] == "charge_card":
			_, err := q.DeadLetter(ctx, m.ID, "max_attempts_reached", "HTTP 503")
			must(t, err)
		default:
			ack(t, q, m.ID)
		}
	}
	c, logs := newTestCollector(t, rdb, WithQueues(QueueFor("shop")))
	got := gather(t, c)
	want(t, got, map[string]float64{
		`backstop_attempts_total{job_type="charge_card",outcome="retry",queue="shop"}`:                   1,
		`backstop_attempts_total{job_type="charge_card",outcome="dead_letter",queue="shop"}`:             2,
		`backstop_attempts_total{job_type="charge_card",outcome="success",queue="shop"}`:                 0,
		`backstop_dead_letters_total{job_type="charge_card",queue="shop",reason="max_attempts_reached"}`: 2,
		`backstop_retries_total{job_type="charge_card",queue="shop",reason="transient"}`:                 1,
		`backstop_job_attempts_count{job_type="charge_card",outcome="dead_letter",queue="shop"}`:         2,
		`backstop_attempts_total{job_type="send_email",outcome="success",queue="shop"}`:                  3,
		`backstop_attempts_total{job_type="send_email",outcome="retry",queue="shop"}`:                    0,
		`backstop_attempts_total{job_type="render_report",outcome="success",queue="shop"}`:               2,
		`backstop_attempts_total{job_type="other",outcome="success",queue="shop"}`:                       1, // fax, past the registry
		`backstop_attempts_total{job_type="",outcome="success",queue="shop"}`:                            2,
		`backstop_attempts_total{job_type="",outcome="dead_letter",queue="shop"}`:                        0,
		`backstop_dead_letters_total{job_type="",queue="shop",reason="max_attempts_reached"}`:            0,
		`backstop_job_types{queue="shop"}`:                                                               3,
		`backstop_job_types_overflow_total{queue="shop"}`:                                                1,
		`backstop_scrape_errors_total{kind="stats"}`:                                                     0,
	}, `backstop_attempts_total{job_type="fax",outcome="success",queue="shop"}`)
	var success float64
	for k, v := range got {
		if strings.HasPrefix(k, "backstop_attempts_total{") && strings.Contains(k, `outcome="success"`) {
			success += v
		}
	}
	if success != 8 {
		t.Errorf("sum of backstop_attempts_total{outcome=\"success\"} = %v, want the 8 jobs acked", success)
	}
	if logs.String() != "" {
		t.Errorf("logs: %s", logs)
	}
}
