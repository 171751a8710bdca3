// Package rabbittest ties the rabbit-server processes of
// internal/rabbitmqserver to tests: started in t.TempDir() and stopped when
// the test ends. A missing or failing rabbitmq-server fails the test loudly
// with the broker's log tail: `make deps` installs it.
//
//	b := rabbittest.Start(t) // stopped when the test ends
//	conn := b.Dial(t)        // closed when the test ends
//
// A broker takes about 6 s to start; a test package can share one (Shared).
package rabbittest

import (
	"testing"

	"github.com/backstop-dev/backstop/internal/rabbitmqserver"
)

// Broker is a rabbitmq-server process owned by a test.
type Broker struct{ *rabbitmqserver.Broker }

// Option configures a broker (rabbitmqserver's options).
type Option = rabbitmqserver.Option

// WithConfig adds lines to the broker's rabbit.conf (new-style sysctl
// format), e.g. "vm_memory_high_watermark.relative = 0.8".
func WithConfig(lines ...string) Option { return rabbitmqserver.WithConfig(lines...) }

// Start starts a broker in t.TempDir() and stops it when the test ends.
// It fails the test (with the log tail) when the broker does not start.
func Start(t testing.TB, opts ...Option) *Broker {
	t.Helper()
	b, err := rabbitmqserver.Start(t.TempDir(), opts...)
	if b != nil {
		t.Cleanup(b.Stop)
	}
	if err != nil {
		t.Fatal(err)
	}
	return &Broker{b}
}

// Restart stops the broker (gracefully) and starts it again with the same
// node name, data directory and ports: durable queues and persistent
// messages survive. It fails t when the broker does not come back.
func (b *Broker) Restart(t testing.TB) {
	t.Helper()
	if err := b.Broker.Restart(); err != nil {
		t.Fatal(err)
	}
}

// KillAndRestart kills the broker (a crash) and starts it again on the
// same data and ports; it fails t when the broker does not come back.
func (b *Broker) KillAndRestart(t testing.TB) {
	t.Helper()
	if err := b.Broker.KillAndRestart(); err != nil {
		t.Fatal(err)
	}
}

// Cluster is n brokers joined into one RabbitMQ cluster on loopback
// (rabbitmqserver.Cluster), owned by a test.
//
//	c := rabbittest.StartCluster(t, 3) // stopped when the test ends
//	c.Nodes[1].KillAndRestart(t)       // a crash of one node
type Cluster struct {
	Nodes []*Broker
	c     *rabbitmqserver.Cluster
}

// StartCluster starts an n-node cluster in t.TempDir() and stops it when
// the test ends; it fails the test (with the log tail of the node at fault)
// when the nodes do not all see each other.
func StartCluster(t testing.TB, n int, opts ...Option) *Cluster {
	t.Helper()
	c, err := rabbitmqserver.StartCluster(t.TempDir(), n, opts...)
	if c != nil {
		t.Cleanup(c.Stop)
	}
	if err != nil {
		t.Fatal(err)
	}
	nodes := make([]*Broker, len(c.Nodes))
	for i, b := range c.Nodes {
		nodes[i] = &Broker{b}
	}
	return &Cluster{Nodes: nodes, c: c}
}

// URLs are the nodes' AMQP URLs, in node order.
func (c *Cluster) URLs() []string { return c.c.URLs() }

// Stop stops every node, each gracefully. Idempotent.
func (c *Cluster) Stop() { c.c.Stop() }
