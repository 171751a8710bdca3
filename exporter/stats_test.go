package exporter

import (
	"context"
	"strconv"
	"testing"

	"github.com/backstop-dev/backstop/internal/redistest"
	"github.com/backstop-dev/backstop/queue"
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
		"backstop_retries_total{queue=\"noisy\"":      maxStatsLabels,
		"backstop_dead_letters_total{queue=\"noisy\"": maxStatsLabels,
		"backstop_attempts_total{":                    maxStatsLabels + 3, // noisy: success, retry, dead_letter and 61 more; calm: 3
		"backstop_job_attempts_count{":                maxStatsLabels,
		"backstop_retries_total{queue=\"calm\"":       1, // not the invalid label values
	} {
		if c := count(prefix); c != n {
			t.Errorf("%d series %s…, want %d", c, prefix, n)
		}
	}
	want(t, got, map[string]float64{
		`backstop_scrape_limit_reached{limit="stats_labels"}`:      1,
		`backstop_retries_total{queue="noisy",reason="r1000"}`:     1,
		`backstop_attempts_total{outcome="success",queue="noisy"}`: 0, // known outcomes stay
		`backstop_attempts_total{outcome="r1060",queue="noisy"}`:   1,
		`backstop_retries_total{queue="calm",reason="transient"}`:  2,
		`backstop_attempts_total{outcome="success",queue="calm"}`:  0,
		`backstop_enqueued_total{queue="noisy"}`:                   1,
	}, `backstop_retries_total{queue="noisy",reason="r1064"}`, `backstop_attempts_total{outcome="r1061",queue="noisy"}`)
}

// Reclaim counts the crash loops the DLQ refused in reclaim_skipped; the
// exporter skipped that field, so a crash loop stuck in a queue (pending,
// never dead-lettered) showed nowhere. It is backstop_reclaim_skipped_total.
func TestReclaimSkippedIsExported(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := queue.New(rdb, "loopy")
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
