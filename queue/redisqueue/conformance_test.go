package redisqueue_test

import (
	"context"
	"testing"
	"time"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/queuetest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// Issue 41: Redis passes the broker-neutral suite, on a real server.
func TestConformance(t *testing.T) {
	queuetest.Run(t, func(t *testing.T) queuetest.Target {
		rdb := redistest.Start(t).Client()
		return queuetest.Target{
			// Promoted and reclaimed quickly: the suite waits for a
			// delayed retry.
			Broker: redisqueue.NewBroker(rdb, redisqueue.WithWorkOptions(redisqueue.WithBatch(16, 100*time.Millisecond),
				redisqueue.WithPromote(50*time.Millisecond, 500))),
			Features: queuetest.Features{Run: true, Counters: true, Delayed: true},
			Audit: func(ctx context.Context, n queue.Names) ([]queuetest.AuditRecord, error) {
				msgs, err := rdb.XRange(ctx, n.Audit, "-", "+").Result()
				var out []queuetest.AuditRecord
				for _, m := range msgs {
					s := func(k string) string { v, _ := m.Values[k].(string); return v }
					out = append(out, queuetest.AuditRecord{Action: s("action"), Note: s("note"), Actor: s("actor"), JobID: s("id")})
				}
				return out, err
			},
		}
	})
}
