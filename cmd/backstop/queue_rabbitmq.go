package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strconv"

	"github.com/backstop-dev/backstop/internal/redact"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/rabbitmq"
)

// rabbitFlags are what the queue commands take for RabbitMQ, the
// alternative to Redis: --amqp.url (env BACKSTOP_AMQP_URL) and, for the
// figures only the management API has, --rabbitmq.management-url.
type rabbitFlags struct {
	amqp *string
	mgmt *string
}

func addRabbitFlags(fs *flag.FlagSet) rabbitFlags {
	return rabbitFlags{
		amqp: fs.String("amqp.url", os.Getenv("BACKSTOP_AMQP_URL"), "RabbitMQ AMQP URL, instead of Redis: amqp://user:password@host:5672/vhost (env BACKSTOP_AMQP_URL)"),
		mgmt: fs.String("rabbitmq.management-url", os.Getenv("BACKSTOP_RABBITMQ_MANAGEMENT_URL"), "with --amqp.url: the management API, http://user:password@host:15672, for the unacked count and backstop console's last hour (env BACKSTOP_RABBITMQ_MANAGEMENT_URL)"),
	}
}

// useRabbit parses args and reports whether the command runs against
// RabbitMQ: --amqp.url given, or BACKSTOP_AMQP_URL set and no Redis flag.
// A flag wins over the environment; two brokers named the same way are a
// usage error. A parse error is left for open to report.
func (f *queueFlags) useRabbit(args []string) (bool, error) {
	if f.fs.Parse(args) != nil {
		return false, nil
	}
	set := map[string]bool{}
	f.fs.Visit(func(fl *flag.Flag) { set[flagName(fl)] = true })
	redisFlag := set["redis.url"] || set["redis.cluster"]
	switch {
	case set["amqp.url"] && redisFlag:
		return false, fmt.Errorf("%w: give --amqp.url or --redis.url/--redis.cluster, not both", errUsage)
	case set["amqp.url"]:
		if *f.rabbit.amqp == "" {
			return false, fmt.Errorf("%w: --amqp.url is empty", errUsage)
		}
		return true, nil
	case redisFlag || *f.rabbit.amqp == "":
		return false, nil
	case os.Getenv("BACKSTOP_REDIS_URL") != "" || os.Getenv("BACKSTOP_REDIS_CLUSTER") != "":
		return false, fmt.Errorf("%w: BACKSTOP_AMQP_URL and BACKSTOP_REDIS_URL (or _CLUSTER) are both set: choose with --amqp.url or --redis.url", errUsage)
	}
	return true, nil
}

// openRabbit connects to RabbitMQ for a queue command.
func (f *queueFlags) openRabbit(ctx context.Context) (queue.Queue, func(), error) {
	if *f.name == "" {
		return nil, nil, fmt.Errorf("%w: --queue is required", errUsage)
	}
	var redisOnly error
	f.fs.Visit(func(fl *flag.Flag) {
		if fl.Name == "group" {
			redisOnly = fmt.Errorf("%w: --group is a Redis consumer group; RabbitMQ has none (drop it with --amqp.url)", errUsage)
		}
	})
	if redisOnly != nil {
		return nil, nil, redisOnly
	}
	b, err := f.rabbitBroker(ctx)
	if err != nil {
		return nil, nil, err
	}
	q, err := b.Open(*f.name)
	if err != nil {
		b.Close()
		return nil, nil, err
	}
	return q, func() { b.Close() }, nil
}

// rabbitBroker connects to the RabbitMQ --amqp.url names.
func (f *queueFlags) rabbitBroker(ctx context.Context) (*rabbitmq.Broker, error) {
	u, err := url.Parse(*f.rabbit.amqp)
	if err != nil {
		return nil, fmt.Errorf("--amqp.url: %w", redact.Error(err, *f.rabbit.amqp))
	}
	if u.Scheme != "amqp" && u.Scheme != "amqps" {
		return nil, fmt.Errorf("--amqp.url: want amqp://user:password@host:5672/vhost or amqps://…, got %q", redact.URL(*f.rabbit.amqp))
	}
	opts := []rabbitmq.Option{rabbitmq.WithLogger(slog.New(slog.DiscardHandler))}
	if *f.rabbit.mgmt != "" {
		// The figures only the management API has (unacked).
		opts = append(opts, rabbitmq.WithStatsOptions(rabbitmq.WithManagementAPI(*f.rabbit.mgmt, nil)))
	}
	b, err := rabbitmq.Open(ctx, *f.rabbit.amqp, opts...)
	if err != nil {
		// One clear line, as for Redis: where, why, what to check.
		return nil, fmt.Errorf("cannot reach RabbitMQ at %s: %w (check --amqp.url or BACKSTOP_AMQP_URL)", u.Host, errors.Unwrap(err))
	}
	return b, nil
}

// orUnknown prints a figure a broker may not have.
func orUnknown(n *int64) string {
	if n == nil {
		return "?"
	}
	return strconv.FormatInt(*n, 10)
}
