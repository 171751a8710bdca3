package redisqueue

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
)

// writeRefused sorts the errors of a real server and a real client: a
// refusal that may pass is worth another attempt, a bad request is not.
func TestWriteRefused(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	// Replies as Redis sends them, raised from a script so that the client
	// parses them as it parses any error reply.
	reply := func(msg string) error {
		return rdb.Eval(ctx, "return redis.error_reply(ARGV[1])", nil, msg).Err()
	}
	q := New(rdb, "classify")
	q.EnsureGroup(ctx)
	rdb.Set(ctx, q.keys.Stats, "not a hash", 0)
	id, _ := rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.keys.Jobs, Values: []string{"id", "j", "attempt", "1", "first_enqueued_ms", "1"}}).Result()
	rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: q.group, Consumer: "c", Streams: []string{q.keys.Jobs, ">"}, Count: 1})
	_, wrongType := q.Ack(ctx, id)
	_, _, badArgv := q.Retry(ctx, id, 0, "because", "e")

	closed := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr})
	closed.Close()
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	refused := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	defer refused.Close()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()

	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"OOM", reply("OOM command not allowed when used memory > 'maxmemory'."), true},
		{"READONLY", reply("READONLY You can't write against a read only replica."), true},
		{"LOADING", reply("LOADING Redis is loading the dataset in memory"), true},
		{"BUSY", reply("BUSY Redis is busy running a script."), true},
		{"MASTERDOWN", reply("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), true},
		{"MISCONF", reply("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk."), true},
		{"TRYAGAIN", reply("TRYAGAIN Multiple keys request during rehashing of slot"), true},
		{"CLUSTERDOWN", reply("CLUSTERDOWN The cluster is down"), true},
		{"NOREPLICAS", reply("NOREPLICAS Not enough good replicas to write."), true},
		{"max clients", reply("ERR max number of clients reached"), true},
		{"connection refused", refused.Ping(ctx).Err(), true},
		{"timeout", context.DeadlineExceeded, true},
		{"wrapped", fmt.Errorf("queue q: ack 1-0: %w", reply("OOM command not allowed")), true},
		{"BUSYGROUP", reply("BUSYGROUP Consumer Group name already exists"), false},
		{"WRONGTYPE", wrongType, false},
		{"bad ARGV", badArgv, false},
		{"NOPERM", reply("NOPERM this user has no permissions to run the 'evalsha' command"), false},
		{"closed client", closed.Ping(ctx).Err(), false},
		{"cancelled", rdb.Ping(cancelled).Err(), false},
	} {
		if c.err == nil {
			t.Errorf("%s: no error to classify", c.name)
			continue
		}
		if got := writeRefused(c.err); got != c.want {
			t.Errorf("%s: writeRefused(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}
