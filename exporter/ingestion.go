package exporter

import (
	"context"
	"fmt"

	"github.com/backstop-dev/backstop/internal/resp"
)

// DLQIngestion is one queue's dead letter ingestion, read as the collector
// reads backstop_dlq_ingested_total, so a reader outside the scrape (the
// alerter of backstop-exporter) gives the same figure.
type DLQIngestion struct {
	Queue string
	// Ingested is the entries ever added to the DLQ (0 for a DLQ that does
	// not exist yet); meaningful only when Known.
	Ingested int64
	// Known is false when the server does not report entries-added and the
	// queue scripts did not write every entry of the DLQ.
	Known bool
	// Size is the DLQ's length now.
	Size int64
	// Err is the failed read of this queue's DLQ; the other fields are
	// then zero.
	Err error
}

// DLQIngestion reads the DLQ ingestion of every queue the collector
// reports (Queues) that has a DLQ, in one pipeline under the collector's
// timeout (WithTimeout), in the order of Queues.
//
// # Errors
//
// The error is a failed discovery's; the queues read are returned even
// then. A failed read of one queue is in its Err.
func (c *Collector) DLQIngestion(ctx context.Context) ([]DLQIngestion, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.timeout)
	defer cancel()
	return c.src.dlqIngestion(ctx)
}

// dlqIngestion reads the DLQs in one pipeline over the transport of its
// own.
func (src *redisSource) dlqIngestion(ctx context.Context) ([]DLQIngestion, error) {
	qs, discoveryErr := src.listQueues(ctx)
	type pending struct {
		name string
		read *dlqRead
	}
	var cmds []pending
	p := resp.NewPipe(src.ingest, nil)
	for _, q := range qs {
		if r := queueDLQRead(p, q, nil); r != nil {
			cmds = append(cmds, pending{q.Name, r})
		}
	}
	if len(cmds) == 0 {
		return nil, discoveryErr
	}
	if p.Exec(ctx) { // else errors are read per command below
		return nil, fmt.Errorf("reading the DLQs: %w", ctx.Err())
	}
	out := make([]DLQIngestion, len(cmds))
	for i, cmd := range cmds {
		f, err := cmd.read.result()
		if err != nil {
			out[i] = DLQIngestion{Queue: cmd.name, Err: err}
			continue
		}
		out[i] = DLQIngestion{Queue: cmd.name, Ingested: f.ingested, Known: f.known, Size: f.size}
	}
	return out, discoveryErr
}

// Queues returns the queues the collector reports: the configured ones and
// those its pattern discovered (from the cached names, as a scrape does),
// sorted by name. The error is a failed discovery's; the configured queues
// are returned even then.
func (c *Collector) Queues(ctx context.Context) ([]Queue, error) {
	return c.src.listQueues(ctx)
}
