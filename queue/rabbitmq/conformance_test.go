package rabbitmq

import (
	"context"
	"log/slog"
	"testing"

	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/queuetest"
)

// Issue 41: RabbitMQ passes the broker-neutral suite, on a real broker;
// it counts no delayed jobs per queue and keeps no counters. Issue 45: it
// runs a delayed job now, held by the worker's mover.
func TestConformance(t *testing.T) {
	queuetest.Run(t, func(t *testing.T) queuetest.Target {
		srv := shared.Broker(t)
		b, err := Open(context.Background(), srv.URL(), WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatal(err)
		}
		conn := srv.Dial(t)
		return queuetest.Target{
			Broker:   b,
			Features: queuetest.Features{Run: true, MissingIsError: true},
			Audit: func(_ context.Context, n queue.Names) ([]queuetest.AuditRecord, error) {
				var out []queuetest.AuditRecord
				for _, d := range drain(t, conn, n.Audit) {
					h := func(k string) string { return headerString(d.Headers, k) }
					out = append(out, queuetest.AuditRecord{Action: h(HeaderAuditAction), Note: h(HeaderAuditNote),
						Actor: h(HeaderAuditActor), JobID: d.MessageId})
				}
				return out, nil
			},
		}
	})
}
