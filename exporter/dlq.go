package exporter

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
)

var (
	dlqSizeDesc     = newDesc("dlq_size", "Entries in the dead letter stream (XLEN).", "queue")
	dlqIngestedDesc = newDesc("dlq_ingested_total", "Entries ever added to the dead letter stream (XINFO STREAM entries-added): counts past trimming, for the DLQ ingestion rate.", "queue")
)

var errNoReply = errors.New("no reply")

// readDLQ reads the dead letter stream with one XINFO STREAM, which gives
// both its length and entries-added. A DLQ that does not exist yet is
// empty.
func readDLQ(ctx context.Context, p redis.Pipeliner, q Queue, _ plan) func(*sink) {
	key := q.Keys.DLQ
	if key == "" {
		return nil
	}
	info := p.XInfoStream(ctx, key)
	return func(s *sink) {
		var size, added int64
		err := info.Err()
		if err == nil && info.Val() == nil {
			err = errNoReply
		}
		switch {
		case err == nil:
			size, added = info.Val().Length, info.Val().EntriesAdded
		case !isMissing(err):
			s.fail(q, key, err)
			return
		}
		s.gauge(dlqSizeDesc, float64(size), q.Name)
		s.counter(dlqIngestedDesc, float64(added), q.Name)
	}
}
