package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/contract"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// BenchmarkQueueRetryCycle applies retry decisions and promotes the jobs
// back: the cold-retry cycle of one job, in batches of 16 jobs per
// pipeline, with 1 and 8 workers against a real redis-server.
//
//   - backstop: the retry script (XACK + XDEL + ZADD + stats, atomic) and the
//     promote script (ZRANGEBYSCORE + XADD + ZREM + stats, atomic).
//   - naive: what people write by hand: XACK as a separate call, then ZADD
//     (and XDEL) in a pipeline; to promote, ZRANGEBYSCORE, then XADD and ZREM
//     in a pipeline. It is not atomic: a crash between the calls loses or
//     duplicates the job, and it keeps no counters.
//
// The reported round trips/job count the pipelines each cycle sends.
func BenchmarkQueueRetryCycle(b *testing.B) {
	srv := redistest.Start(b)
	rdb := srv.Client()
	for _, workers := range []int{1, 8} {
		for _, impl := range []string{"backstop", "naive"} {
			b.Run(fmt.Sprintf("%s/workers=%d", impl, workers), func(b *testing.B) {
				ctx := context.Background()
				rdb.FlushAll(ctx)
				var next atomic.Int64
				var trips atomic.Int64
				b.ResetTimer()
				var wg sync.WaitGroup
				per := (b.N + workers - 1) / workers
				for w := 0; w < workers; w++ {
					wg.Add(1)
					go func(w int) {
						defer wg.Done()
						q := redisqueue.New(rdb, "bench-"+strconv.Itoa(w))
						q.EnsureGroup(ctx)
						for done := 0; done < per; done += 16 {
							ids := prepare(b, ctx, rdb, q, 16, &next)
							if impl == "backstop" {
								trips.Add(backstopCycle(ctx, rdb, q, ids))
							} else {
								trips.Add(naiveCycle(ctx, rdb, q, ids))
							}
						}
					}(w)
				}
				wg.Wait()
				jobs := float64(workers * ((per + 15) / 16) * 16)
				b.ReportMetric(jobs/b.Elapsed().Seconds(), "jobs/s")
				b.ReportMetric(float64(trips.Load())/jobs, "round-trips/job")
			})
		}
	}
}

// prepare enqueues n jobs and reads them, so they are pending (not timed
// separately: both contenders pay it the same).
func prepare(b *testing.B, ctx context.Context, rdb redis.UniversalClient, q *redisqueue.Queue, n int, next *atomic.Int64) []string {
	p := rdb.Pipeline()
	for i := 0; i < n; i++ {
		p.XAdd(ctx, &redis.XAddArgs{Stream: q.Keys().Jobs, Values: []any{"id", strconv.FormatInt(next.Add(1), 10), "attempt", "1", "first_enqueued_ms", "1", "payload", "x"}})
	}
	if _, err := p.Exec(ctx); err != nil {
		b.Fatal(err)
	}
	res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: q.Group(), Consumer: "c", Streams: []string{q.Keys().Jobs, ">"}, Count: int64(n)}).Result()
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]string, 0, n)
	for _, m := range res[0].Messages {
		ids = append(ids, m.ID)
	}
	return ids
}

func backstopCycle(ctx context.Context, rdb redis.UniversalClient, q *redisqueue.Queue, ids []string) int64 {
	p := rdb.Pipeline()
	for _, id := range ids {
		// queue.Retry, pipelined: the script is loaded by the first call.
		p.EvalSha(ctx, retrySHA(ctx, rdb), []string{q.Keys().Jobs, q.Keys().Delayed, q.Keys().Stats}, q.Group(), id, 0, "transient", "503")
	}
	p.Exec(ctx)
	for moved := 0; moved < len(ids); {
		n, _, _ := q.Promote(ctx, len(ids))
		// A 0 ms retry is due at once on Redis's clock: ask again, the
		// round trip is the only pause.
		moved += n
	}
	return 2
}

var (
	shaOnce sync.Once
	sha     string
)

func retrySHA(ctx context.Context, rdb redis.UniversalClient) string {
	shaOnce.Do(func() {
		src, _ := contract.ScriptSource("retry")
		sha = rdb.ScriptLoad(ctx, src).Val()
	})
	return sha
}

func naiveCycle(ctx context.Context, rdb redis.UniversalClient, q *redisqueue.Queue, ids []string) int64 {
	k := q.Keys()
	p := rdb.Pipeline()
	for _, id := range ids {
		p.XAck(ctx, k.Jobs, q.Group(), id)
	}
	p.Exec(ctx)
	p = rdb.Pipeline()
	now := float64(time.Now().UnixMilli())
	for _, id := range ids {
		p.ZAdd(ctx, k.Delayed, redis.Z{Score: now, Member: `{"id":"` + id + `","attempt":2,"payload":"x"}`})
		p.XDel(ctx, k.Jobs, id)
	}
	p.Exec(ctx)
	members, _ := rdb.ZRangeByScore(ctx, k.Delayed, &redis.ZRangeBy{Min: "-inf", Max: strconv.FormatInt(time.Now().UnixMilli(), 10), Count: int64(len(ids))}).Result()
	p = rdb.Pipeline()
	for _, m := range members {
		p.XAdd(ctx, &redis.XAddArgs{Stream: k.Jobs, Values: []any{"job", m}})
		p.ZRem(ctx, k.Delayed, m)
	}
	p.Exec(ctx)
	return 4
}
