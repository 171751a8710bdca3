package exporter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/resp"
)

var (
	memoryUsedDesc = newDesc("redis_memory_used_bytes", "Memory the Redis node uses (INFO memory used_memory).", "node")
	memoryMaxDesc  = newDesc("redis_memory_max_bytes", "The Redis node's memory limit (maxmemory), 0 when it has none. Over it Redis refuses writes (policy noeviction: backstop_redis_rejected_writes_total{reason=\"oom\"}) or evicts keys (any other policy: backstop_redis_evicted_keys_total).", "node")
	memoryPolicy   = newDesc("redis_memory_policy_info", "The Redis node's maxmemory-policy, as the policy label; always 1.", "node", "policy")
	rejectedDesc   = newDesc("redis_rejected_writes_total", "Commands the Redis node refused because it cannot take writes, by reason: oom (over maxmemory with policy noeviction), misconf (a failed RDB snapshot with stop-writes-on-bgsave-error), readonly (the node is a replica), noreplicas (min-replicas-to-write not met). From INFO errorstats, since the node started or its CONFIG RESETSTAT. A refused ack or retry leaves the job pending, to be delivered again.", "node", "reason")
	evictedDesc    = newDesc("redis_evicted_keys_total", "Keys the Redis node evicted to stay under maxmemory (INFO stats evicted_keys): an evicted queue key is jobs, retries or dead letters lost.", "node")
)

// refusals maps the error codes of INFO errorstats that refuse a write to
// the reason label of backstop_redis_rejected_writes_total.
var refusals = []struct{ code, reason string }{
	{"OOM", "oom"}, {"MISCONF", "misconf"}, {"READONLY", "readonly"}, {"NOREPLICAS", "noreplicas"},
}

// node is what one Redis node says about its memory and refused writes.
type node struct {
	name     string // its address, the node label
	info     map[string]string
	err      error
	fallback string // the address to use when the node does not say its own
}

// infoSections are the INFO sections the exporter reads, in one command.
var infoSections = []string{"memory", "stats", "errorstats"}

// readNodes starts reading INFO memory, stats and errorstats from the
// node the client talks to, or from every master of a cluster (in
// parallel), beside the queues' pipelines; the function it returns waits
// for the replies (until ctx ends) and reports them. The exporter never
// writes, so it cannot see a refused write itself, but Redis counts them.
// The node label is the node's address as it sees it (CLIENT INFO laddr:
// a Sentinel-managed client does not know the master's), else as the
// client knows it. Replicas are not read: writes go to masters.
func (src *redisSource) readNodes(ctx context.Context) func(*sink) {
	var nodes []*node
	var mu sync.Mutex
	read := func(ctx context.Context, rdb redis.Cmdable, addr string) {
		n := readNode(ctx, rdb, addr)
		mu.Lock()
		nodes = append(nodes, n)
		mu.Unlock()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		switch rdb := src.rdb.(type) {
		case *redis.ClusterClient:
			err := rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
				read(ctx, m, m.Options().Addr)
				return nil
			})
			if err != nil { // no master known: the cluster is down
				mu.Lock()
				nodes = append(nodes, &node{err: err})
				mu.Unlock()
			}
		case *redis.Client:
			read(ctx, rdb, rdb.Options().Addr)
		default:
			read(ctx, rdb, "")
		}
	}()
	return func(s *sink) {
		select {
		case <-done:
		case <-ctx.Done():
			s.fail(Queue{}, "", fmt.Errorf("INFO of the Redis nodes: %w", ctx.Err()))
			return
		}
		for _, n := range nodes {
			if n.err != nil {
				s.fail(Queue{}, "", fmt.Errorf("INFO of node %s: %w", n.fallback, n.err))
				continue
			}
			n.report(s)
		}
	}
}

func readNode(ctx context.Context, rdb redis.Cmdable, addr string) *node {
	p := rdb.Pipeline()
	info := p.Info(ctx, infoSections...)
	me := p.ClientInfo(ctx)
	cmds, err := p.Exec(ctx)
	resp.StampUnanswered(cmds, err)
	n := &node{name: addr, fallback: addr, err: info.Err()}
	if unsupported(n.err) {
		// A server whose INFO takes one section (Redis 6, the embedded
		// server of backstop demo) reports none of these figures: they are
		// left out, which is not an error of the scrape.
		n.err, n.info = nil, map[string]string{}
	}
	if n.err != nil {
		return n
	}
	if ci := me.Val(); me.Err() == nil && ci != nil && ci.LAddr != "" {
		n.name = ci.LAddr
	}
	n.info = parseInfo(info.Val())
	return n
}

// unsupported reports an error reply that says the server does not take
// the command as sent: Redis 6 answers INFO with several sections "ERR
// syntax error", the embedded server "ERR wrong number of arguments".
func unsupported(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	for _, prefix := range []string{"ERR wrong number of arguments", "ERR syntax error", "ERR unknown command", "ERR unknown subcommand"} {
		if strings.HasPrefix(rerr.Error(), prefix) {
			return true
		}
	}
	return false
}

// parseInfo reads the field:value lines of INFO, and each "# Section"
// header as the field "#section" (lower case) with an empty value: a
// section can be there without a field (Errorstats before the first
// error).
func parseInfo(text string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if section, ok := strings.CutPrefix(line, "#"); ok {
			out["#"+strings.ToLower(strings.TrimSpace(section))] = ""
		} else if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = v
		}
	}
	return out
}

func (n *node) report(s *sink) {
	if validName(n.name) != nil {
		n.name = "unknown"
	}
	num := func(field string) (float64, bool) {
		v, err := strconv.ParseFloat(n.info[field], 64)
		return v, err == nil
	}
	if v, ok := num("used_memory"); ok {
		s.gauge(memoryUsedDesc, v, n.name)
	}
	if v, ok := num("maxmemory"); ok {
		s.gauge(memoryMaxDesc, v, n.name)
	}
	if p := n.info["maxmemory_policy"]; validName(p) == nil {
		s.gauge(memoryPolicy, 1, n.name, p)
	}
	if v, ok := num("evicted_keys"); ok {
		s.counter(evictedDesc, v, n.name)
	}
	if _, ok := n.info["#errorstats"]; !ok {
		return // no INFO errorstats (Redis < 6.2): no count, not a count of 0
	}
	for _, r := range refusals {
		// errorstat_OOM:count=3 (absent until the first such error)
		count := 0.0
		if stat, ok := strings.CutPrefix(n.info["errorstat_"+r.code], "count="); ok {
			v, _, _ := strings.Cut(stat, ",")
			count, _ = strconv.ParseFloat(v, 64)
		}
		s.counter(rejectedDesc, count, n.name, r.reason)
	}
}
