package exporter

import (
	"context"
	"errors"
	"fmt"

	"github.com/backstop-dev/backstop/internal/resp"
	"github.com/backstop-dev/backstop/queue/rabbitmq/rabbitnames"
)

// Totals is one queue's cumulative retries and dead letters, read as the
// collector reads backstop_retries_total and backstop_dlq_ingested_total,
// for a reader that keeps its own history of them instead of a
// Prometheus (backstop console's overview: rates over its samples).
type Totals struct {
	Queue string
	// Retries is the retries ever scheduled: on Redis the sum of
	// backstop_retries_total over reasons and job types (the stats hash;
	// 0 before the queue's first job). RabbitMQ does not count retries
	// (the workers do, in their own metrics): there it is the messages
	// ever published into the queue's delay exchange, retries but also
	// deferrals and delayed enqueues, an upper bound (RetriesUpperBound).
	// Meaningful only when RetriesKnown.
	Retries           int64
	RetriesKnown      bool
	RetriesUpperBound bool
	// Ingested is backstop_dlq_ingested_total; meaningful only when
	// IngestedKnown (DLQIngestion says when it is not).
	Ingested      int64
	IngestedKnown bool
	// Err is the failed read of this queue; the figures are then unknown.
	Err error
}

// Totals reads the retries and DLQ ingestion of every queue the collector
// reports (Queues), with the readers of a scrape (readStats and readDLQ on
// Redis, the management API's queues and exchanges on RabbitMQ) but
// nothing else, under the collector's timeout, in the order of Queues.
// The counts start again from 0 where the broker's do (a RabbitMQ
// restart, a deleted stats hash): a reader takes a decrease as a reset.
//
// # Errors
//
// The error is a failed discovery's, or on RabbitMQ a failed read of the
// management API (no queue is returned then). A failed read of one Redis
// queue is in its Err.
func (c *Collector) Totals(ctx context.Context) ([]Totals, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.timeout)
	defer cancel()
	return c.src.totals(ctx)
}

// totals reads every queue's stats hash and DLQ in one pipeline over the
// transport DLQIngestion uses (never waiting for a scrape), each queue's
// replies turned into samples by readStats and readDLQ in a sink of its
// own, so that an error is the queue's.
func (src *redisSource) totals(ctx context.Context) ([]Totals, error) {
	qs, discoveryErr := src.listQueues(ctx)
	if len(qs) == 0 {
		return nil, discoveryErr
	}
	scratch := makeCounts()
	pl := plan{now: src.cfg.now(), stats: map[string]resp.Ref{}, totals: &scratch, names: map[string]string{}}
	p := resp.NewPipe(src.ingest, nil)
	reads := make([][]func(*sink), len(qs))
	for i, q := range qs {
		for _, r := range []reader{readDLQ, readStats} {
			if f := r(p, q, pl); f != nil {
				reads[i] = append(reads[i], f)
			}
		}
	}
	if p.Exec(ctx) { // else errors are read per command below
		return nil, fmt.Errorf("reading the queues' totals: %w", ctx.Err())
	}
	out := make([]Totals, len(qs))
	for i, q := range qs {
		s := &sink{log: src.cfg.log, kinds: map[string]error{}}
		for _, f := range reads[i] {
			f(s)
		}
		out[i] = Totals{Queue: q.Name}
		var errs []error
		for _, err := range s.kinds {
			errs = append(errs, err)
		}
		if err := errors.Join(errs...); err != nil {
			out[i].Err = err
			continue
		}
		// A queue without a stats hash key has no retry count; one whose
		// hash does not exist yet has retried nothing.
		out[i].RetriesKnown = q.Keys.Stats != ""
		s.samples.all(func(m *sample) {
			switch m.desc {
			case retriesDesc:
				out[i].Retries += int64(m.value)
			case dlqIngestedDesc:
				out[i].Ingested, out[i].IngestedKnown = int64(m.value), true
			}
		})
	}
	return out, discoveryErr
}

// totals is Totals for RabbitMQ: from one reading of the management API,
// the DLQ's publishes (backstop_dlq_ingested_total) and the delay
// exchange's publish_in (what delayedEstimate counts as entering the
// delay).
func (r *rabbitSource) totals(ctx context.Context) ([]Totals, error) {
	st, err := r.read(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Totals, 0, len(st.work))
	for _, name := range st.work {
		t := Totals{Queue: name}
		names := rabbitnames.For(name)
		if dlq := st.queues[names.DLQ]; dlq != nil {
			t.Ingested, t.IngestedKnown = dlq.Stats.Publish, true
		}
		if x, ok := st.exchanges[names.Delay]; ok {
			t.Retries, t.RetriesKnown, t.RetriesUpperBound = x.PublishIn, true, true
		}
		out = append(out, t)
	}
	return out, nil
}
