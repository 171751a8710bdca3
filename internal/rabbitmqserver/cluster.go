package rabbitmqserver

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Cluster is n rabbitmq-server processes joined into one RabbitMQ cluster
// on loopback: each node with its own ports, node name, data and log
// directories, all sharing one Erlang cookie. Quorum queues declared on it
// get a member on every node (their default initial group size is the
// cluster's size), so a node can be killed and restarted while the other
// two keep a quorum.
//
//	c, err := rabbitmqserver.StartCluster(dir, 3)
//	c.Nodes[1].KillAndRestart() // a crash of one node
type Cluster struct {
	Nodes []*Broker
}

// StartCluster starts an n-node cluster in dir. The first node starts
// alone; the others find it through classic peer discovery and join it at
// their first boot. It returns once every node sees n running nodes; on an
// error the nodes already started come back too, for the caller to Stop.
func StartCluster(dir string, n int, opts ...Option) (*Cluster, error) {
	return startCluster(dir, n, opts)
}

func startCluster(dir string, n int, opts []Option) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("rabbitmqserver: a cluster needs at least 1 node, got %d", n)
	}
	ports, err := freePorts(3 * n) // in one go, so no two nodes draw the same
	if err != nil {
		return nil, err
	}
	secret := make([]byte, 16)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("rabbitmqserver: cookie: %w", err)
	}
	cookie := []byte(hex.EncodeToString(secret))
	c := &Cluster{}
	for i := range n {
		nodeOpts := append(append([]Option{}, opts...), func(b *Broker) { b.ports = ports[3*i : 3*i+3] })
		if i > 0 {
			first := c.Nodes[0].name
			nodeOpts = append(nodeOpts, WithConfig("cluster_formation.peer_discovery_backend = classic_config",
				"cluster_formation.classic_config.nodes.1 = "+first))
		}
		b, err := newBroker(filepath.Join(dir, fmt.Sprintf("node%d", i+1)), false, nodeOpts)
		if err != nil {
			return c, err
		}
		// The CLI tools and the nodes read the cookie from HOME; Erlang
		// refuses one that others can read.
		if err := os.WriteFile(filepath.Join(b.dir, "home", ".erlang.cookie"), cookie, 0o400); err != nil {
			return c, fmt.Errorf("rabbitmqserver: %w", err)
		}
		c.Nodes = append(c.Nodes, b)
	}
	if err := c.Nodes[0].start(); err != nil {
		return c, err
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 1; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.Nodes[i].start()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return c, err
		}
	}
	for _, b := range c.Nodes {
		if err := waitFor(startTimeout, func() bool { return b.RunningNodes() == n }); err != nil {
			return c, fmt.Errorf("rabbitmqserver: %s sees %d running nodes of %d; log tail:\n%s", b.name, b.RunningNodes(), n, b.LogTail(40))
		}
	}
	return c, nil
}

// RunningNodes is how many cluster nodes the broker's management API
// reports running (-1 when it does not answer).
func (b *Broker) RunningNodes() int {
	req, _ := http.NewRequest(http.MethodGet, b.ManagementURL()+"/api/nodes", nil)
	req.SetBasicAuth("guest", "guest")
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var nodes []struct {
		Running bool `json:"running"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&nodes) != nil {
		return -1
	}
	running := 0
	for _, n := range nodes {
		if n.Running {
			running++
		}
	}
	return running
}

// URLs are the nodes' AMQP URLs, in node order.
func (c *Cluster) URLs() []string {
	urls := make([]string, len(c.Nodes))
	for i, b := range c.Nodes {
		urls[i] = b.URL()
	}
	return urls
}

// Stop stops every node (the others first, then the first one), each
// gracefully. Idempotent.
func (c *Cluster) Stop() {
	for i := len(c.Nodes) - 1; i >= 0; i-- {
		c.Nodes[i].Stop()
	}
}
