package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/rabbitmq"
)

// The queues and exchanges of a work queue, as the broker-neutral
// queue.Names and tests read them.
func ExampleNamesFor() {
	n := rabbitmq.NamesFor("emails")
	fmt.Println(n.Queue, n.DLQ, n.Delay, n.Due, n.Audit)
	// Output:
	// emails emails.dlq emails.delay emails.due emails.audit
}

// A Broker is a queue.Broker: a worker and an operator's replay through
// the broker-neutral interface, the same code as on Redis. What RabbitMQ
// cannot do yet says so: errors.Is(err, queue.ErrUnsupported).
func ExampleBroker_Open() {
	ctx := context.Background()
	b, err := rabbitmq.Open(ctx, "amqp://guest:guest@127.0.0.1:5672/",
		rabbitmq.WithWorkOptions(rabbitmq.WithPrefetch(32)))
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	var br queue.Broker = b
	q, err := br.Open("emails")
	if err != nil {
		log.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, "welcome-42", []byte(`{"to":"ada@example.com"}`), queue.EnqueueOptions{Type: "welcome", Delay: time.Minute}); err != nil {
		log.Fatal(err)
	}
	p, err := policy.Parse([]byte(`{"max_attempts": 5, "backoff": {"base": "1s", "cap": "1m"}}`))
	if err != nil {
		log.Fatal(err)
	}
	go q.Work(ctx, backstop.Native(p), func(ctx context.Context, j queue.Job) error {
		return &backstop.Failure{HTTPStatus: 503, Err: errors.New("smtp relay unavailable")}
	}, queue.WorkOptions{Concurrency: 16})

	n, err := q.Replay(ctx, queue.ReplayOptions{Limit: 100, Reason: "max_attempts_reached"})
	fmt.Println(n, err)
	// A delayed job now, from the delay levels or a worker's mover (issue 45).
	r, err := q.Run(ctx, queue.RunOptions{ID: "welcome-42"})
	fmt.Println(r.Moved, err)
}
