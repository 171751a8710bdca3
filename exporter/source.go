package exporter

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/resp"
)

// A source is where a Collector reads its queues: Redis (redisSource,
// NewCollector) or RabbitMQ's management API (rabbitSource,
// NewRabbitMQCollector). The Collector adds what does not depend on the
// broker: the budget, the exporter's own metrics (health) and sharing a
// scrape between concurrent requests.
type source interface {
	// scrape reads every queue once into s, within ctx (the scrape's
	// budget), and returns how many queues it reported (backstop_queues).
	// Its errors are s's: health reports them.
	scrape(ctx context.Context, s *sink) (queues int)
	// listQueues is Collector.Queues.
	listQueues(ctx context.Context) ([]Queue, error)
	// dlqIngestion is Collector.DLQIngestion, within ctx (the collector's
	// timeout already applied).
	dlqIngestion(ctx context.Context) ([]DLQIngestion, error)
	// totals is Collector.Totals, within ctx (the collector's timeout
	// already applied).
	totals(ctx context.Context) ([]Totals, error)
	// close closes the source's own connections, if it has any.
	close() error
	// ready says whether the source answers now (Collector.Ready).
	ready(ctx context.Context) error
}

var (
	_ source = (*redisSource)(nil)
	_ source = (*rabbitSource)(nil)
)

// redisSource reads the queues of a Redis client in pipelines
// (internal/resp), and the nodes' memory and refused writes.
type redisSource struct {
	rdb    redis.UniversalClient
	tr     resp.Transport // how the queues are read
	ingest resp.Transport // the same for DLQIngestion, so that it never waits for a scrape
	cfg    *config        // the collector's
	disc   *discovery     // nil without a pattern
	// sizes is how much the largest batch of the last scrape read (one
	// scrape runs at a time): the next scrape's arena starts that large
	// instead of growing to it by doubling.
	sizes struct{ nodes, buf int }
}

// scrape reads every queue once, and the nodes' memory and refusals.
func (src *redisSource) scrape(ctx context.Context, s *sink) int {
	nodes := src.readNodes(ctx) // beside the queues: a down Redis costs one dial timeout, not two
	qs := src.queues(ctx, s)
	src.read(ctx, qs, s)
	nodes(s)
	return len(qs)
}

func (src *redisSource) listQueues(ctx context.Context) ([]Queue, error) {
	s := &sink{log: src.cfg.log, kinds: map[string]error{}}
	qs := src.queues(ctx, s)
	for _, err := range s.kinds {
		return qs, err
	}
	return qs, nil
}

// ready pings Redis (a node of a cluster).
func (src *redisSource) ready(ctx context.Context) error { return src.rdb.Ping(ctx).Err() }

func (src *redisSource) close() error {
	return errors.Join(src.tr.Close(), src.ingest.Close())
}
