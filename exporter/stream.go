package exporter

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	pendingDesc       = newDesc("stream_pending_jobs", "Entries delivered to the group's consumers and not finished yet (XINFO GROUPS pending).", "queue", "group")
	lagDesc           = newDesc("stream_lag_jobs", "Entries not delivered to the group yet (XINFO GROUPS lag); absent while Redis cannot tell (after deletions ahead of the group).", "queue", "group")
	oldestPendingDesc = newDesc("stream_oldest_pending_seconds", "Age of the oldest pending entry (from its stream id), 0 when none is pending.", "queue", "group")
	deliveriesDesc    = newDesc("stream_pending_deliveries", "Delivery counts of the group's oldest pending entries (an XPENDING sample of 10 to 100, _count says how many): entries delivered again and again are crash loops on their way to the DLQ. A gauge in histogram form: read the buckets, do not rate() them.", "queue", "group")
)

// The XPENDING sample of each group is its oldest pending entries, the
// ones a crash loop keeps (a reclaimed entry keeps its id): at most
// maxSample of them, fewer when a scrape reads many groups so that it
// reads about sampleBudget entries in all, but at least minSample. Reading
// 100 entries costs Redis some 16 µs, ten times a plain command: without
// the budget, 1,000 queues with backlogs would double the scrape.
const (
	maxSample    = 100
	minSample    = 10
	sampleBudget = 10000
)

// sampleSize is the XPENDING sample per group when a scrape reads groups
// groups.
func sampleSize(groups int) int64 {
	return int64(max(minSample, min(maxSample, sampleBudget/max(groups, 1))))
}

var deliveryBuckets = []float64{1, 2, 3, 5, 10}

// readStreams reads the jobs stream's groups (XINFO GROUPS) and a bounded
// XPENDING sample of each group to report. A stream or group that does not
// exist yet gives no metrics and no error.
func readStreams(ctx context.Context, p redis.Pipeliner, q Queue, pl plan) func(*sink) {
	key := q.Keys.Jobs
	if key == "" {
		return nil
	}
	groups := p.XInfoGroups(ctx, key)
	samples := make([]*redis.XPendingExtCmd, len(q.Groups))
	for i, g := range q.Groups {
		samples[i] = p.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: key, Group: g, Start: "-", End: "+", Count: pl.sample})
	}
	return func(s *sink) {
		if err := groups.Err(); err != nil {
			if !isMissing(err) {
				s.fail(q, key, err)
			}
			return
		}
		info := make(map[string]redis.XInfoGroup, len(groups.Val()))
		for _, g := range groups.Val() {
			info[g.Name] = g
		}
		for i, name := range q.Groups {
			g, ok := info[name]
			if !ok {
				continue // not created yet
			}
			sample, err := samples[i].Result()
			if err != nil {
				if !isMissing(err) {
					s.fail(q, key, err)
				}
				continue
			}
			s.gauge(pendingDesc, float64(g.Pending), q.Name, name)
			if g.Lag >= 0 { // go-redis gives -1 for Redis's NULL: unknown, not 0
				s.gauge(lagDesc, float64(g.Lag), q.Name, name)
			}
			if g.Pending > int64(len(sample)) {
				s.reached(limitPendingSample) // the histogram covers the oldest only
			}
			s.gauge(oldestPendingDesc, oldestAge(sample, pl.now), q.Name, name)
			var sum float64
			cum := make([]uint64, len(deliveryBuckets)+1) // the last one is +Inf
			for _, e := range sample {
				sum += float64(e.RetryCount)
				i, _ := slices.BinarySearch(deliveryBuckets, float64(e.RetryCount))
				cum[i]++
			}
			for i := 1; i < len(cum); i++ {
				cum[i] += cum[i-1]
			}
			s.histogram(deliveriesDesc, deliveryBuckets, cum[:len(deliveryBuckets)], uint64(len(sample)), sum, q.Name, name)
		}
	}
}

// oldestAge is the age of the first (lowest id, so oldest) sampled entry,
// from the milliseconds of its id.
func oldestAge(sample []redis.XPendingExt, now time.Time) float64 {
	if len(sample) == 0 {
		return 0
	}
	msPart, _, _ := strings.Cut(sample[0].ID, "-")
	ms, err := strconv.ParseInt(msPart, 10, 64)
	if err != nil {
		return 0
	}
	return max(0, float64(now.UnixMilli()-ms)/1000)
}
