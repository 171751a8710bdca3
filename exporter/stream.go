package exporter

import (
	"slices"
	"strconv"
	"time"

	"github.com/backstop-dev/backstop/internal/resp"
)

var (
	pendingDesc       = newDesc("stream_pending_jobs", "Entries delivered to the group's consumers and not finished yet (XINFO GROUPS pending).", "queue", "group")
	lagDesc           = newDesc("stream_lag_jobs", "Entries not delivered to the group yet (XINFO GROUPS lag); absent while Redis cannot tell (after deletions ahead of the group), and once the group has delivered entries on a server that does not report its entries-read, the counter Redis computes the lag from (Redis 6; the embedded server of backstop demo, whose lag is the stream's length, pending entries included).", "queue", "group")
	oldestPendingDesc = newDesc("stream_oldest_pending_seconds", "Age of the oldest pending entry (from its stream id), 0 when none is pending.", "queue", "group")
	deliveriesDesc    = newDesc("stream_pending_deliveries", "Delivery counts of the group's oldest pending entries (an XPENDING sample of 10 to 100, _count says how many): entries delivered again and again are crash loops on their way to the DLQ. A gauge in histogram form: read the buckets, do not rate() them.", "queue", "group").asHistogram()
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
// XPENDING sample of each group. Every group of the stream is reported,
// whatever its name: the configured ones (Queue.Groups) are sampled in the
// scrape's pipeline, any other one in a second pipeline once XINFO GROUPS
// has named it, so a stream whose workers use another group is not left
// without pending and lag series. A stream or group that does not exist
// yet gives no metrics and no error.
func readStreams(p *resp.Pipe, q Queue, pl plan) func(*sink) {
	key := q.Keys.Jobs
	if key == "" {
		return nil
	}
	groups := p.Do("XINFO", "GROUPS", key)
	samples := make([]resp.Ref, len(q.Groups))
	for i, g := range q.Groups {
		samples[i] = xpendingSample(p, key, g, pl)
	}
	return func(s *sink) {
		v := p.Reply(groups)
		if err := v.Err(); err != nil {
			if !isMissing(err) {
				s.fail(q, key, err)
			}
			return
		}
		s.seen(q) // the stream exists, with or without groups
		info, err := groupInfo(v)
		if err != nil {
			s.fail(q, key, err)
			return
		}
		for i, name := range q.Groups {
			if g, ok := info[name]; ok { // else not created yet
				reportGroup(s, q, name, g, p.Reply(samples[i]), pl)
			}
		}
		var others []string // nil for the usual stream, whose groups are all configured
		for name := range info {
			if !slices.Contains(q.Groups, name) {
				others = append(others, name)
			}
		}
		slices.Sort(others)
		for _, name := range others {
			g := info[name]
			s.later = append(s.later, func(p *resp.Pipe) func(*sink) {
				sample := xpendingSample(p, key, name, pl)
				return func(s *sink) { reportGroup(s, q, name, g, p.Reply(sample), pl) }
			})
		}
	}
}

func xpendingSample(p *resp.Pipe, key, group string, pl plan) resp.Ref {
	return p.Do("XPENDING", key, group, "-", "+", strconv.FormatInt(pl.sample, 10))
}

// reportGroup adds the metrics of group name, g as XINFO GROUPS gave it and
// sample its XPENDING sample.
func reportGroup(s *sink, q Queue, name string, g group, sample resp.Reply, pl plan) {
	if err := sample.Err(); err != nil {
		if !isMissing(err) {
			s.fail(q, q.Keys.Jobs, err)
		}
		return
	}
	n := max(sample.Len(), 0)
	s.gauge(pendingDesc, float64(g.pending), q.Name, name)
	if g.lagKnown {
		s.gauge(lagDesc, float64(g.lag), q.Name, name)
	}
	if g.pending > int64(n) {
		s.reached(limitPendingSample) // the histogram covers the oldest only
	}
	s.gauge(oldestPendingDesc, oldestAge(sample, pl.now), q.Name, name)
	var sum float64
	cum := make([]uint64, len(deliveryBuckets)+1) // the last one is +Inf
	sample.Elems(func(e resp.Reply) bool {
		// [id consumer idle-ms deliveries]
		var deliveries int64
		i := 0
		e.Elems(func(f resp.Reply) bool {
			if i == 3 {
				deliveries, _ = f.Int()
			}
			i++
			return i < 4
		})
		sum += float64(deliveries)
		i, _ = slices.BinarySearch(deliveryBuckets, float64(deliveries))
		cum[i]++
		return true
	})
	for i := 1; i < len(cum); i++ {
		cum[i] += cum[i-1]
	}
	s.histogram(deliveriesDesc, deliveryBuckets, cum[:len(deliveryBuckets)], uint64(n), sum, q.Name, name)
}

// group is what XINFO GROUPS says of one consumer group.
type group struct {
	pending  int64
	lag      int64
	lagKnown bool
}

// groupInfo reads an XINFO GROUPS reply by group name. A group's lag is
// taken when the server reports it together with the group's entries-read,
// the counter Redis computes it from (entries-added minus entries-read),
// or with a NULL entries-read while the group has delivered nothing
// (last-delivered-id 0-0): every entry is undelivered then, and Redis's
// estimate is the stream's length. Redis reports a NULL lag when it cannot
// tell, Redis 6 neither field, and the embedded server of backstop demo
// always a NULL entries-read with the stream's length as the lag, pending
// entries included: right only before the group's first delivery. A lag
// Redis 7 estimates for a group that has delivered entries while its
// entries-read is NULL (deletions ahead of it) is left out too: nothing in
// the reply tells it apart from the embedded server's.
func groupInfo(v resp.Reply) (map[string]group, error) {
	if v.Len() < 0 {
		return nil, badReply("XINFO GROUPS reply is not an array: " + v.String())
	}
	out := make(map[string]group, v.Len())
	var err error
	v.Elems(func(raw resp.Reply) bool {
		name, ok := raw.Field("name").Str()
		pending, ok2 := raw.Field("pending").Int()
		if !ok || !ok2 {
			err = badReply("XINFO GROUPS entry without a name or pending count: " + raw.String())
			return false
		}
		g := group{pending: pending}
		if lag, ok := raw.Field("lag").Int(); ok {
			_, read := raw.Field("entries-read").Int()
			last, _ := raw.Field("last-delivered-id").Str()
			g.lag, g.lagKnown = lag, read || last == "0-0" || last == "0" // the embedded server says 0
		}
		out[name] = g
		return true
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// oldestAge is the age of the first (lowest id, so oldest) sampled entry,
// from the milliseconds of its id.
func oldestAge(sample resp.Reply, now time.Time) float64 {
	ms, ok := idMs(sample.First().First().Bytes())
	if !ok {
		return 0
	}
	return max(0, float64(now.UnixMilli()-ms)/1000)
}
