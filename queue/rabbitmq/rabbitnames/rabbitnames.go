// Package rabbitnames names the RabbitMQ queues and exchanges of a backstop
// work queue (queue/rabbitmq/README.md, "Topology"): the names alone, with
// no client, so that a reader of the management API (the exporter) need
// not link the worker. Package rabbitmq re-exports it (rabbitmq.Names,
// rabbitmq.NamesFor).
package rabbitnames

import "strconv"

// Names are the parts of one work queue.
type Names struct {
	Queue string // the work queue Q (quorum)
	DLQ   string // its dead letters, Q.dlq
	Delay string // the exchange a delayed job enters the shared delay levels by, Q.delay
	Due   string // the exchange a due job comes back to Q by, Q.due
	Audit string // the discarded dead letters' record, Q.audit
}

// For returns the names of work queue q.
func For(q string) Names {
	return Names{Queue: q, DLQ: q + ".dlq", Delay: q + ".delay", Due: q + ".due", Audit: q + ".audit"}
}

// The delay levels every work queue of a virtual host shares: level n
// (2^n s) is the exchange and first-topology TTL queue DelayLevel(n), 0..17,
// and, for the levels the workers' movers empty, the hold queue
// HoldLevel(n), 0..10.
const (
	DelayLevelPrefix = "backstop.delay.L"
	HoldLevelPrefix  = "backstop.hold.L"
)

// DelayLevel names delay level n's exchange and TTL queue.
func DelayLevel(n int) string { return DelayLevelPrefix + strconv.Itoa(n) }

// HoldLevel names delay level n's hold queue.
func HoldLevel(n int) string { return HoldLevelPrefix + strconv.Itoa(n) }
