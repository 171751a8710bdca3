package redisqueue

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// clockSync is how often a worker reads the server's clock again.
const clockSync = 10 * time.Second

// serverClock is Redis' clock as a worker can tell it: the worker's own
// clock plus the offset TIME showed at the last sync. The scripts stamp
// first_enqueued_ms with TIME, so a job's elapsed time (the policy's
// max_elapsed) is measured on this clock, not on the worker's: two workers
// whose clocks differ by minutes decide the same.
type serverClock struct {
	local  func() time.Time // the worker's clock: time.Now (a test skews it)
	offset atomic.Int64     // ns to add to local: TIME minus local at the last sync
	synced atomic.Int64     // local unix ns of the last sync; 0: never
}

func newServerClock(local func() time.Time) *serverClock {
	if local == nil {
		local = time.Now
	}
	return &serverClock{local: local}
}

// now is the server's time, as of the last sync (the worker's own clock
// before the first).
func (c *serverClock) now() time.Time {
	return c.local().Add(time.Duration(c.offset.Load()))
}

// sync reads TIME when the last sync is older than clockSync, taking the
// middle of the round trip as the moment Redis read its clock. A failed read
// keeps the last offset.
func (c *serverClock) sync(ctx context.Context, rdb redis.UniversalClient) {
	if last := c.synced.Load(); last != 0 && c.local().UnixNano()-last < int64(clockSync) {
		return
	}
	before := c.local()
	t, err := rdb.Time(ctx).Result()
	if err != nil {
		return
	}
	after := c.local()
	c.offset.Store(int64(t.Sub(before.Add(after.Sub(before) / 2))))
	c.synced.Store(after.UnixNano())
}
