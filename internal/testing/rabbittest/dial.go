package rabbittest

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Dial opens an AMQP connection to the broker as guest, closed when the
// test ends; it fails the test when the broker does not accept it.
//
//	conn := b.Dial(t)
func (b *Broker) Dial(t testing.TB) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(b.URL())
	if err != nil {
		t.Fatalf("rabbittest: dial %s: %v", b.URL(), err)
	}
	// Closing one the test closed (or that a broker stop broke) only errs.
	t.Cleanup(func() { conn.Close() })
	return conn
}

// Channel opens a channel on a new connection (Dial), to look at or feed
// the broker with; both close when the test ends.
func (b *Broker) Channel(t testing.TB) *amqp.Channel {
	t.Helper()
	ch, err := b.Dial(t).Channel()
	if err != nil {
		t.Fatalf("rabbittest: channel: %v", err)
	}
	return ch
}

// Drain takes every message of queue q on ch (acked), in order, and
// returns them; it fails the test on a broker error.
func Drain(t testing.TB, ch *amqp.Channel, q string) []amqp.Delivery {
	t.Helper()
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(q, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}
