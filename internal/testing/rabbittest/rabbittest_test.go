package rabbittest

import (
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop/internal/rabbitmqserver"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
)

// One broker: start, a durable queue with a persistent message survives a
// Restart and a crash (Kill and start), Stop leaves no beam process.
func TestStartRestartKill(t *testing.T) {
	b := Start(t)
	if !strings.HasPrefix(b.URL(), "amqp://guest:guest@127.0.0.1:") {
		t.Fatalf("URL() = %q", b.URL())
	}
	publish(t, b, "kept")
	b.Restart(t)
	if n := depth(t, b, "kept"); n != 1 {
		t.Fatalf("after Restart the queue holds %d messages, want 1", n)
	}
	b.KillAndRestart(t)
	if n := depth(t, b, "kept"); n != 1 {
		t.Fatalf("after Kill and start the queue holds %d messages, want 1", n)
	}
	req, _ := http.NewRequest(http.MethodGet, b.ManagementURL()+"/api/queues/%2F/kept", nil)
	req.SetBasicAuth("guest", "guest")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("management API: %v %v", resp, err)
	}
	resp.Body.Close()
	b.Stop()
	if b.Running() {
		t.Fatal("Running() after Stop")
	}
	if out, _ := exec.Command("pgrep", "-f", b.Node()).Output(); len(out) != 0 {
		t.Fatalf("processes of %s left after Stop: %s", b.Node(), out)
	}
	b.Stop() // idempotent
}

func publish(t *testing.T, b *Broker, q string) {
	t.Helper()
	ch := b.Channel(t)
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirm("", q, false, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte("x")})
	if err != nil || !dc.Wait() {
		t.Fatalf("publish not confirmed: %v", err)
	}
}

func depth(t *testing.T, b *Broker, q string) int {
	t.Helper()
	ch := b.Channel(t)
	st, err := ch.QueueDeclarePassive(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	if err != nil {
		t.Fatal(err)
	}
	return st.Messages
}

// A broker that cannot start fails with the reason and its log.
func TestStartFailsLoudly(t *testing.T) {
	_, err := rabbitmqserver.Start("", WithConfig("listeners.tcp.default = not-a-port"))
	if err == nil || !strings.Contains(err.Error(), "log tail") {
		t.Fatalf("Start with a broken config = %v, want an error with the log tail", err)
	}
}

// Three nodes form one cluster; a quorum queue declared through the first
// keeps its message while that node is dead, and the node rejoins when it
// starts again.
func TestClusterKeepsAQuorum(t *testing.T) {
	c := StartCluster(t, 3)
	if len(c.URLs()) != 3 || c.URLs()[0] == c.URLs()[1] {
		t.Fatalf("URLs() = %v, want 3 distinct", c.URLs())
	}
	publish(t, c.Nodes[0], "replicated")
	out, err := c.Nodes[1].Ctl("list_queues", "name", "type", "members", "--quiet")
	if err != nil || !strings.Contains(out, c.Nodes[2].Node()) {
		t.Fatalf("the quorum queue has no member on node 3: %v\n%s", err, out)
	}
	c.Nodes[0].Kill()
	// Node 1 led the queue: the others elect a new leader first.
	if err := eventually.Wait(60*time.Second, func() bool { return depth(t, c.Nodes[1], "replicated") == 1 }); err != nil {
		t.Fatalf("with node 1 dead, node 2 sees %d messages, want 1", depth(t, c.Nodes[1], "replicated"))
	}
	c.Nodes[0].KillAndRestart(t) // already dead: only started again
	if n := c.Nodes[2].RunningNodes(); n != 3 {
		t.Fatalf("after node 1's restart node 3 sees %d running nodes, want 3", n)
	}
	if n := depth(t, c.Nodes[0], "replicated"); n != 1 {
		t.Fatalf("node 1 sees %d messages after its restart, want 1", n)
	}
}
