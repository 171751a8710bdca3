// Package redistest starts real redis-server processes (the Debian
// package) on free loopback ports for tests: a standalone server or a
// Redis Cluster of several masters. A missing redis-server fails the test
// loudly: `make test` installs it.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a redis-server process owned by a test.
type Server struct {
	t    testing.TB
	Addr string
	dir  string
	args []string
	cmd  *exec.Cmd
}

func binary(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found on PATH: run `make test`, which installs the Debian package redis-server", name)
	}
	return path
}

// freePort returns a loopback port that was free a moment ago, at most
// 55535 (below Redis's default cluster bus port, port+10000; StartCluster
// sets the bus port to a free one of its own).
func freePort(t testing.TB) int {
	t.Helper()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if port <= 55535 {
			return port
		}
	}
}

// Start starts a standalone redis-server, stopped when the test ends.
func Start(t testing.TB, extraArgs ...string) *Server {
	t.Helper()
	s := &Server{t: t, dir: t.TempDir()}
	port := freePort(t)
	s.Addr = "127.0.0.1:" + strconv.Itoa(port)
	s.args = append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", s.dir, "--protected-mode", "no"}, extraArgs...)
	s.start()
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) start() {
	s.t.Helper()
	s.cmd = exec.Command(binary(s.t, "redis-server"), s.args...)
	s.cmd.Dir = s.dir
	log, err := os.Create(s.dir + "/redis.log")
	if err != nil {
		s.t.Fatal(err)
	}
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(s.dir + "/redis.log")
			s.Stop() // Start registers Stop only once the server answers
			s.t.Fatalf("redis-server on %s did not answer: %s", s.Addr, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills the server (idempotent).
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
}

// Restart stops the server and starts it again on the same port (its data
// is gone: the test servers do not persist).
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.start()
}

// Client returns a client for the server, closed when the test ends.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	s.t.Cleanup(func() { c.Close() })
	return c
}

// Cluster is a Redis Cluster of masters without replicas.
type Cluster struct {
	Addrs   []string
	servers []*Server
}

// StartCluster starts a cluster of n masters and waits until every node
// reports cluster_state:ok.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{}
	for i := 0; i < n; i++ {
		// The bus port is picked free too: port+10000, Redis's default,
		// may be taken by another server of a test running alongside.
		s := Start(t, "--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(freePort(t)),
			"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
		c.servers = append(c.servers, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(binary(t, "redis-cli"), args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for _, addr := range c.Addrs {
		node := redis.NewClient(&redis.Options{Addr: addr})
		for {
			info, _ := node.ClusterInfo(ctx).Result()
			if strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				node.Close()
				t.Fatalf("cluster node %s not ready: %s", addr, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		node.Close()
	}
	return c
}

// Client returns a cluster client, closed when the test ends.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
	t.Cleanup(func() { cc.Close() })
	return cc
}

// String describes the cluster for test logs.
func (c *Cluster) String() string { return fmt.Sprintf("cluster%v", c.Addrs) }

// Sentinel is a redis-server in sentinel mode watching one master, named
// "backstop".
type Sentinel struct {
	Addr   string
	Master string
	server *Server
}

// StartSentinel starts a sentinel that monitors master, and waits until it
// answers for it.
func StartSentinel(t testing.TB, master *Server) *Sentinel {
	t.Helper()
	s := &Server{t: t, dir: t.TempDir()}
	port := freePort(t)
	s.Addr = "127.0.0.1:" + strconv.Itoa(port)
	host, mport, _ := net.SplitHostPort(master.Addr)
	conf := fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\nsentinel monitor backstop %s %s 1\nsentinel down-after-milliseconds backstop 1000\n", port, s.dir, host, mport)
	if err := os.WriteFile(s.dir+"/sentinel.conf", []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	s.args = []string{s.dir + "/sentinel.conf", "--sentinel"}
	s.start()
	t.Cleanup(s.Stop)
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if addr, err := c.GetMasterAddrByName(context.Background(), "backstop").Result(); err == nil && len(addr) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sentinel on %s does not know the master", s.Addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return &Sentinel{Addr: s.Addr, Master: "backstop", server: s}
}

// Client returns a failover client through the sentinel.
func (s *Sentinel) Client(t testing.TB) *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.Master, SentinelAddrs: []string{s.Addr}})
	t.Cleanup(func() { c.Close() })
	return c
}
