package redisqueue_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// Each broker names its queue's parts: code that reports or cleans up a
// queue asks it rather than build a key. Opening a queue touches no
// server.
func ExampleBroker_Open() {
	b := redisqueue.NewBroker(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}))
	defer b.Close()
	q, err := b.Open("emails")
	if err != nil {
		log.Fatal(err)
	}
	n := q.Names()
	fmt.Println(b.Kind(), q.Name())
	fmt.Println(n.Jobs, n.Delayed, n.DLQ, n.Stats, n.Audit)
	// Output:
	// redis emails
	// {emails}:jobs {emails}:delayed {emails}:dlq {emails}:stats {emails}:audit
}

// A worker and an operator's replay through the broker-neutral interface:
// the same code runs on RabbitMQ with rabbitmq.Open's Broker instead.
func ExampleNewBroker() {
	ctx := context.Background()
	var b queue.Broker = redisqueue.NewBroker(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}),
		redisqueue.WithQueueOptions(redisqueue.WithGroup("mailers")))
	defer b.Close()
	q, err := b.Open("emails")
	if err != nil {
		log.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, "welcome-42", []byte(`{"to":"ada@example.com"}`), queue.EnqueueOptions{Type: "welcome"}); err != nil {
		log.Fatal(err)
	}
	p, err := policy.Parse([]byte(`{"max_attempts": 5, "backoff": {"base": "1s", "cap": "1m"}}`))
	if err != nil {
		log.Fatal(err)
	}
	go q.Work(ctx, backstop.Native(p), func(ctx context.Context, j queue.Job) error {
		return &backstop.Failure{HTTPStatus: 503, Err: errors.New("smtp relay unavailable")}
	}, queue.WorkOptions{Concurrency: 4})

	// Later, once the relay is back: the first 100 dead letters that ran
	// out of attempts go back to the queue, their attempts reset.
	n, err := q.Replay(ctx, queue.ReplayOptions{Limit: 100, Reason: "max_attempts_reached"})
	fmt.Println(n, err)
}
