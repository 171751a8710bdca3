package exporter

import (
	"bufio"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/redistest"
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
		if _, ok := c.tr.(*connTransport); !ok {
			t.Fatalf("%s: transport %T, want the collector's own connection", name, c.tr)
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
	if _, ok := c.tr.(*connTransport); !ok {
		t.Fatalf("sentinel: transport %T, want the collector's own connection", c.tr)
	}
	for range 2 { // a connection dialled through the Sentinel for each scrape
		want(t, gather(t, c), map[string]float64{"backstop_up": 1, `backstop_dlq_ingested_total{queue="orders"}`: 2})
	}
}

// TestReadRESP reads every kind of RESP2 and RESP3 reply, and refuses
// what is not RESP without a panic.
func TestReadRESP(t *testing.T) {
	in := "+OK\r\n-ERR no\r\n:42\r\n:-7\r\n$5\r\nhello\r\n$-1\r\n*-1\r\n_\r\n#t\r\n,1.5\r\n(12345678901234567890\r\n" +
		"=8\r\ntxt:abcd\r\n%2\r\n$1\r\na\r\n:1\r\n$1\r\nb\r\n*2\r\n:2\r\n:3\r\n~1\r\n+x\r\n|1\r\n+key\r\n+val\r\n:9\r\n!3\r\nBAD\r\n"
	var r replies
	rd := bufio.NewReader(strings.NewReader(in))
	for range 16 {
		r.roots = append(r.roots, int32(len(r.nodes)))
		must(t, r.read(rd, 0))
	}
	got := make([]string, len(r.roots))
	for i := range r.roots {
		v := r.reply(ref(i))
		if err := v.err(); err != nil {
			got[i] = "error " + err.Error()
		} else {
			got[i] = v.String()
		}
	}
	want := []string{"OK", "error ERR no", "42", "-7", "hello", "<nil>", "<nil>", "<nil>", "1", "1.5", "12345678901234567890",
		"abcd", "[a 1 b [2 3]]", "[x]", "9", "error BAD"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("replies\n%q\nwant\n%q", got, want)
	}
	if b, _ := r.reply(12).field("b").str(); b != "" {
		t.Errorf("field b of a map holding an array: %q", b)
	}
	if n, ok := r.reply(12).field("a").int(); !ok || n != 1 {
		t.Errorf("field a: %d %v", n, ok)
	}
	for _, bad := range []string{"?\r\n", "$3\r\nab", ":x\r\n", "*2\r\n:1\r\n", "$-5\r\n", "$3\r\nabcd\r\n", strings.Repeat("*1\r\n", 40) + ":1\r\n", "+no end"} {
		var r replies
		err := r.read(bufio.NewReader(strings.NewReader(bad)), 0)
		if !errors.Is(err, errBadReply) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			t.Errorf("%q: %v, want a malformed reply or a short read", bad, err)
		}
	}
}
