// Package rediskeys names the Redis keys of a backstop queue
// (queue/redisqueue/README.md, "Keys"): the layout alone, with no client,
// so that a reader of the keys (the exporter) need not link the worker.
// Package redisqueue re-exports it (redisqueue.Keys, redisqueue.KeysFor).
package rediskeys

import "strings"

// Keys names the Redis keys of one queue. For gives the default layout,
// where every key shares the hash tag {name} so the scripts work on a Redis
// Cluster; set the fields by hand to drive an existing layout (keys of one
// queue must still hash to one slot on a cluster).
type Keys struct {
	Jobs    string // stream of work
	Delayed string // sorted set of cold retries, score = due time (unix ms)
	DLQ     string // stream of dead letters
	Stats   string // hash of counters
}

// For returns the default keys of queue name: {name}:jobs, {name}:delayed,
// {name}:dlq and {name}:stats.
func For(name string) Keys {
	tag := "{" + name + "}"
	return Keys{Jobs: tag + ":jobs", Delayed: tag + ":delayed", DLQ: tag + ":dlq", Stats: tag + ":stats"}
}

// Audit is the stream the discarded dead letters of a queue with keys k
// are recorded in: {Q}:audit for the default keys (beside {Q}:dlq, so in its
// hash slot); for another layout the DLQ's key with its ":dlq" suffix
// replaced by ":audit" (or ":audit" appended).
func (k Keys) Audit() string {
	if base, ok := strings.CutSuffix(k.DLQ, ":dlq"); ok {
		return base + ":audit"
	}
	return k.DLQ + ":audit"
}
