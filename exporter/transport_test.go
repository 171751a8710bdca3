package exporter

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/resp"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
)

// TestOwnConnectionLogsIn reads the queues over the collector's own
// connection as the client's options say: an ACL user and password, a
// database other than 0, a client name; and through a Sentinel.
func TestOwnConnectionLogsIn(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	must(t, srv.Client().ConfigSet(ctx, "requirepass", "admin-secret").Err())
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "admin-secret"})
	t.Cleanup(func() { admin.Close() })
	must(t, admin.Do(ctx, "ACL", "SETUSER", "reader", "on", ">reader-secret", "~*", "+@all").Err())
	in2 := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "admin-secret", DB: 2})
	t.Cleanup(func() { in2.Close() })
	prepareOrders(t, in2)

	for name, opt := range map[string]*redis.Options{
		"user and password":    {Addr: srv.Addr, Username: "reader", Password: "reader-secret", DB: 2, ClientName: "backstop-exporter"},
		"credentials provider": {Addr: srv.Addr, DB: 2, CredentialsProvider: func() (string, string) { return "reader", "reader-secret" }},
	} {
		rdb := redis.NewClient(opt)
		t.Cleanup(func() { rdb.Close() })
		c, logs := newTestCollector(t, rdb, WithQueues(QueueFor("orders")))
		if _, ok := transportOf(c).(*resp.ConnTransport); !ok {
			t.Fatalf("%s: transport %T, want the collector's own connection", name, transportOf(c))
		}
		want(t, gather(t, c), map[string]float64{"backstop_up": 1, `backstop_dlq_ingested_total{queue="orders"}`: 2})
		if logs.String() != "" {
			t.Errorf("%s: unexpected logs:\n%s", name, logs)
		}
	}
	names, err := admin.ClientList(ctx).Result()
	must(t, err)
	if !strings.Contains(names, "name=backstop-exporter") {
		t.Errorf("no client named backstop-exporter:\n%s", names)
	}

	master := redistest.Start(t)
	prepareOrders(t, master.Client())
	rdb := redistest.StartSentinel(t, master).Client(t)
	c, _ := newTestCollector(t, rdb, WithQueues(QueueFor("orders")))
	if _, ok := transportOf(c).(*resp.ConnTransport); !ok {
		t.Fatalf("sentinel: transport %T, want the collector's own connection", transportOf(c))
	}
	for range 2 { // a connection dialled through the Sentinel for each scrape
		want(t, gather(t, c), map[string]float64{"backstop_up": 1, `backstop_dlq_ingested_total{queue="orders"}`: 2})
	}
}
