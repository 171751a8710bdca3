package rabbitmq

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop/internal/testing/eventually"
)

// The delay precision, proved without waiting a day: the topology the
// broker holds after Declare (its bindings, read back from the management
// API) is walked for every delay from 1 ms to 24 h at whole seconds and
// just past them. Each delay takes exactly one path, ends in the work
// queue, and the holds on that path (2^n s in hold.L<n>, the mover's)
// sum to the delay rounded up to whole seconds: never early, at most
// max(1 s, 5 %) late; a delay past maxDelaySecs holds maxDelaySecs and is
// delayed again on arrival (TestEarlyDeliveryWaits). The hops themselves
// are timed for real by the reliability tests for 1, 3 and 10 s. Then the
// broker routes a few keys for real, and a message hops two levels for
// real, moved by a worker's mover, never dead-lettered by the broker.
func TestDelayRoutingAcrossTheRange(t *testing.T) {
	broker := shared.Broker(t)
	ctx := context.Background()
	b, err := Open(ctx, broker.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	q := b.Queue("precise")
	if err := q.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	topo := readTopology(t, broker.ManagementURL())

	walkStart := time.Now()
	checked := 0
	type result struct {
		path []string
		ttl  int64
	}
	walked := map[string]result{} // by routing key: many delays round to one
	for s := int64(1); s <= 24*3600; s++ {
		for _, d := range []time.Duration{time.Duration(s) * time.Second, time.Duration(s)*time.Second - 999*time.Millisecond,
			time.Duration(s)*time.Second - time.Millisecond} {
			key := delayRoutingKey(delaySeconds(d))
			w, seen := walked[key]
			if !seen {
				w.path, w.ttl = topo.walk(t, "precise.delay", key, "precise")
				walked[key] = w
			}
			path, ttl := w.path, w.ttl
			if d > maxDelaySecs*time.Second {
				if ttl != maxDelaySecs*1000 {
					t.Fatalf("a delay of %v: the levels %v hold it %d ms, want %d s (the rest on arrival)", d, path, ttl, maxDelaySecs)
				}
				checked++
				continue
			}
			late := time.Duration(ttl)*time.Millisecond - d
			if late < 0 || late > max(time.Second, d/20) {
				t.Fatalf("a delay of %v takes %v through %v: %v late (at most max(1s, 5%%)), or early", d, time.Duration(ttl)*time.Millisecond, path, late)
			}
			if ttl != delaySeconds(d)*1000 {
				t.Fatalf("a delay of %v: the levels %v hold it %d ms, want %d s", d, path, ttl, delaySeconds(d))
			}
			checked++
		}
	}
	// A zero or negative delay skips every level; the longest one hops all.
	if path, ttl := topo.walk(t, "precise.delay", delayRoutingKey(delaySeconds(0)), "precise"); ttl != 0 || len(path) != 0 {
		t.Errorf("a zero delay goes through %v (%d ms)", path, ttl)
	}
	if path, ttl := topo.walk(t, "precise.delay", delayRoutingKey(delaySeconds(1000*time.Hour)), "precise"); ttl != maxDelaySecs*1000 || len(path) != holdLevels {
		t.Errorf("a delay past the levels goes through %v (%d ms), want all %d hold levels, %d s", path, ttl, holdLevels, maxDelaySecs)
	}
	t.Logf("%d delays walked through the declared topology in %v", checked, time.Since(walkStart))

	ch := broker.Channel(t)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	publish := func(id string, secs int64) {
		t.Helper()
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "precise.delay", delayRoutingKey(secs), true, false, amqp.Publishing{
			MessageId: id, DeliveryMode: amqp.Persistent, Body: []byte(id),
			Headers: amqp.Table{HeaderDestination: "precise", HeaderAttempt: "1", HeaderFirstEnqueuedMs: "1"}})
		if err != nil || !dc.Wait() {
			t.Fatalf("publish %s: %v", id, err)
		}
	}
	// The broker routes each key to the level of its highest bit.
	for _, c := range []struct {
		secs  int64
		level int
	}{{1, 0}, {3, 1}, {10, 3}, {1500, 10}, {maxDelaySecs, 10}} {
		id := "route-" + strconv.FormatInt(c.secs, 10)
		publish(id, c.secs)
		var got amqp.Delivery
		eventually.True(t, 10*time.Second, id+" in level "+strconv.Itoa(c.level), func() bool {
			d, ok, err := ch.Get(holdQueue+strconv.Itoa(c.level), true)
			if err != nil {
				t.Fatal(err)
			}
			got = d
			return ok
		})
		if got.MessageId != id {
			t.Fatalf("level %d holds %q, want %s", c.level, got.MessageId, id)
		}
	}

	// A real hop through hold.L1 and hold.L0 (3 s), moved by a mover (a
	// worker's, without the worker): it arrives no earlier than 3 s after,
	// with its key, and with no x-death: the broker dead-lettered nothing.
	mctx, stop := context.WithCancel(ctx)
	moved := make(chan struct{})
	go func() { defer close(moved); q.move(mctx) }()
	defer func() { stop(); <-moved }()
	sent := time.Now()
	publish("hop", 3)
	var got amqp.Delivery
	eventually.True(t, 30*time.Second, "the hop through hold.L1 and hold.L0 to arrive", func() bool {
		d, ok, err := ch.Get("precise", true)
		if err != nil {
			t.Fatal(err)
		}
		got = d
		return ok
	})
	took := time.Since(sent)
	if got.MessageId != "hop" || got.RoutingKey != delayRoutingKey(3) || got.Headers["x-death"] != nil || took < 3*time.Second {
		t.Fatalf("arrived %q with key %s, x-death %v, %v after, want hop with key %s, no x-death, 3 s or more after",
			got.MessageId, got.RoutingKey, got.Headers["x-death"], took, delayRoutingKey(3))
	}
}

// topology is what the broker holds: bindings by source, and the TTL and
// dead-letter exchange of each queue that has them.
type topology struct {
	bindings map[string][]binding // by source exchange
	kinds    map[string]string    // exchange → type
	queues   map[string]queueArgs
}

type binding struct {
	Source          string         `json:"source"`
	Destination     string         `json:"destination"`
	DestinationType string         `json:"destination_type"`
	RoutingKey      string         `json:"routing_key"`
	Arguments       map[string]any `json:"arguments"`
	words           []string       // RoutingKey's words
}

type queueArgs struct {
	Name      string         `json:"name"`
	Arguments map[string]any `json:"arguments"`
}

func mgmtGet(t *testing.T, base, path string, v any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+path, nil)
	req.SetBasicAuth("guest", "guest")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", path, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
}

func readTopology(t *testing.T, base string) *topology {
	var bs []binding
	mgmtGet(t, base, "/api/bindings/%2F", &bs)
	var xs []struct{ Name, Type string }
	mgmtGet(t, base, "/api/exchanges/%2F", &xs)
	var qs []queueArgs
	mgmtGet(t, base, "/api/queues/%2F", &qs)
	topo := &topology{bindings: map[string][]binding{}, kinds: map[string]string{}, queues: map[string]queueArgs{}}
	for _, b := range bs {
		b.words = strings.Split(b.RoutingKey, ".")
		topo.bindings[b.Source] = append(topo.bindings[b.Source], b)
	}
	for _, x := range xs {
		topo.kinds[x.Name] = x.Type
	}
	for _, q := range qs {
		topo.queues[q.Name] = q
	}
	return topo
}

// routes lists where exchange x sends a message with key and headers.
func (topo *topology) routes(x, key string, words []string, headers map[string]string) []binding {
	var out []binding
	for _, b := range topo.bindings[x] {
		match := false
		switch topo.kinds[x] {
		case "fanout":
			match = true
		case "topic":
			match = topicMatch(b.words, words)
		case "headers":
			match = true
			for k, v := range b.Arguments {
				if !strings.HasPrefix(k, "x-") && headers[k] != fmt.Sprint(v) {
					match = false
				}
			}
		case "direct":
			match = b.RoutingKey == key
		}
		if match {
			out = append(out, b)
		}
	}
	return out
}

// topicMatch matches a pattern of literal words and '*' (the levels use
// no '#').
func topicMatch(ps, ks []string) bool {
	if len(ps) != len(ks) {
		return false
	}
	for i := range ps {
		if ps[i] != "*" && ps[i] != ks[i] {
			return false
		}
	}
	return true
}

// walk follows a message published to exchange x with key (destination
// dest) through exchanges and hold queues (a mover publishes on to the
// next level's exchange) or TTL level queues (each dead-letters to its
// x-dead-letter-exchange on expiry) until it reaches a queue without a
// TTL, which must be dest. It fails t unless every step routes to exactly
// one place; it returns the level queues passed and their summed TTL (ms).
func (topo *topology) walk(t *testing.T, x, key, dest string) (levels []string, ttl int64) {
	headers := map[string]string{HeaderDestination: dest}
	words := strings.Split(key, ".")
	for steps := 0; ; steps++ {
		if steps > 4*delayBits {
			t.Fatalf("key %s: no end after %d steps through %v", key, steps, levels)
		}
		rs := topo.routes(x, key, words, headers)
		if len(rs) != 1 {
			t.Fatalf("key %s: exchange %s routes to %d places (%v), want 1; path so far %v", key, x, len(rs), rs, levels)
		}
		r := rs[0]
		if r.DestinationType == "exchange" {
			x = r.Destination
			continue
		}
		if n, ok := strings.CutPrefix(r.Destination, holdQueue); ok {
			// A mover holds it 2^n s, then publishes it to exchange L<n-1>.
			level, _ := strconv.Atoi(n)
			levels = append(levels, r.Destination)
			ttl += int64(1000) << level
			x = deliverXchg
			if level > 0 {
				x = delayExchange + strconv.Itoa(level-1)
			}
			continue
		}
		q := topo.queues[r.Destination]
		msTTL, has := q.Arguments["x-message-ttl"].(float64)
		if !has {
			if r.Destination != dest {
				t.Fatalf("key %s: arrives in %s, want %s", key, r.Destination, dest)
			}
			return levels, ttl
		}
		levels = append(levels, r.Destination)
		ttl += int64(msTTL)
		dlx, _ := q.Arguments["x-dead-letter-exchange"].(string)
		x = dlx
	}
}
