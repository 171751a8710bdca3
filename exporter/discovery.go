package exporter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/queue/redisqueue/rediskeys"
)

// discovery finds queues by SCAN MATCH on every master and caches their
// names between refreshes.
type discovery struct {
	rdb     redis.UniversalClient
	pattern string
	every   time.Duration
	max     int
	log     *slog.Logger

	mu      sync.Mutex
	found   *found        // the last successful refresh's; nil before one
	at      time.Time     // when found was refreshed
	running chan struct{} // closed when the running refresh ends; nil when none runs
	err     error         // the last refresh's error, for the next scrape to report
}

// found is what one discovery found: the queues' names and what became of
// the matching keys (backstop_discovery_keys).
type found struct {
	names     []string // sorted, distinct
	queueKeys int      // keys of the queues named
	skipped   int      // keys that name no queue
	overLimit int      // keys past the max, counted but not taken
	example   string   // a skipped key, for the log
}

func checkPattern(pattern string, refresh time.Duration, maxKeys int) error {
	open := strings.IndexByte(pattern, '{')
	if open < 0 || strings.IndexByte(pattern[open:], '}') < 2 {
		return fmt.Errorf("queues pattern %q has no hash tag: the queue name is the tag's content, as in {*}:jobs", pattern)
	}
	if refresh <= 0 {
		return fmt.Errorf("queues pattern: refresh interval must be positive, got %v", refresh)
	}
	if maxKeys <= 0 {
		return fmt.Errorf("queues pattern: max keys must be positive, got %d", maxKeys)
	}
	return nil
}

// refreshBudget bounds one refresh: a SCAN walks the whole keyspace, so it
// gets more time than a scrape, and runs in the background.
func (d *discovery) refreshBudget() time.Duration { return max(d.every, time.Minute) }

// names returns what the last successful refresh found. It starts a
// refresh in the background when that is older than the interval, and
// waits for it (until ctx ends) only when there is none yet. The error is
// the last failed refresh's, reported once.
func (d *discovery) names(ctx context.Context) (*found, error) {
	d.mu.Lock()
	if d.running == nil && (d.found == nil || time.Since(d.at) >= d.every) {
		d.running = make(chan struct{})
		go d.refresh(d.running)
	}
	wait := d.running
	if d.found != nil {
		wait = nil
	}
	d.mu.Unlock()
	if wait != nil {
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, fmt.Errorf("first SCAN of %q still running: %w", d.pattern, ctx.Err())
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	err := d.err
	d.err = nil
	return d.found, err
}

func (d *discovery) refresh(done chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), d.refreshBudget())
	defer cancel()
	start := time.Now()
	f, err := d.scan(ctx)
	d.mu.Lock()
	if err == nil {
		d.found, d.at = f, time.Now()
	}
	d.err = err
	d.running = nil
	d.mu.Unlock()
	// Logged before the scrape waiting for it goes on: what the scrape
	// reports, the log has said.
	defer close(done)
	if err != nil {
		d.log.Error("queue discovery failed", "pattern", d.pattern, "err", err)
		return
	}
	if f.skipped > 0 {
		d.log.Warn("keys matching the queues pattern are not keys of a queue in the default layout", "pattern", d.pattern, "skipped", f.skipped, "example", fmt.Sprintf("%q", f.example))
	}
	if f.overLimit > 0 {
		d.log.Warn("queue discovery stopped at max keys", "pattern", d.pattern, "max_keys", d.max, "queues", len(f.names), "keys_left_out", f.overLimit)
	} else {
		d.log.Debug("queues discovered", "pattern", d.pattern, "queues", len(f.names), "took", time.Since(start))
	}
}

type scanner interface {
	Scan(ctx context.Context, cursor uint64, match string, count int64) *redis.ScanCmd
}

// scan SCANs every master (in parallel on a cluster) and returns the
// sorted, distinct queues named by at most max matching keys. Past max it
// goes on counting the matching keys, without keeping them, so the
// metrics say how many are left out; when the budget runs out meanwhile
// the count is a lower bound and the names are kept.
func (d *discovery) scan(ctx context.Context) (*found, error) {
	var mu sync.Mutex
	seen := map[string]bool{}
	f := &found{}
	taken := 0
	scanOne := func(ctx context.Context, c scanner) error {
		it := c.Scan(ctx, 0, d.pattern, 1000).Iterator()
		for it.Next(ctx) {
			key := it.Val()
			mu.Lock()
			switch name, ok := queueOfKey(key); {
			case taken >= d.max:
				f.overLimit++
			case ok:
				taken++
				f.queueKeys++
				seen[name] = true
			default:
				taken++
				f.skipped++
				if f.example == "" {
					f.example = key
				}
			}
			mu.Unlock()
		}
		return it.Err()
	}
	var err error
	if cc, ok := d.rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			if err := scanOne(ctx, c); err != nil {
				return fmt.Errorf("scan %s: %w", c.Options().Addr, err)
			}
			return nil
		})
	} else {
		err = scanOne(ctx, d.rdb)
	}
	// ForEachMaster returns once every scan has.
	if err != nil && !(f.overLimit > 0 && kindOf(err) == kindTimeout) {
		return nil, fmt.Errorf("scan %q: %w", d.pattern, err)
	}
	for n := range seen {
		f.names = append(f.names, n)
	}
	slices.Sort(f.names)
	return f, nil
}

// queueOfKey returns the queue whose key, in the default layout, is key:
// key must be exactly {Q}:jobs, {Q}:delayed, {Q}:dlq or {Q}:stats
// (rediskeys.For), with {Q} the key's hash tag as Redis Cluster reads it,
// from the first '{' to the first '}' after it. So {a}x}:jobs (tag a, and
// {a}:jobs is another key), {}:jobs (no tag), x{a}:jobs and {a}:jobs:old
// name no queue. Q must also be a valid queue name (validName): it becomes
// a label value.
func queueOfKey(key string) (string, bool) {
	if !strings.HasPrefix(key, "{") {
		return "", false
	}
	end := strings.IndexByte(key, '}')
	name := key[1:max(end, 1)]
	if end < 0 || validName(name) != nil {
		return "", false
	}
	switch k := rediskeys.For(name); key {
	case k.Jobs, k.Delayed, k.DLQ, k.Stats:
		return name, true
	}
	return "", false
}

// validName checks a queue or group name, which becomes a label value: not
// empty, valid UTF-8 (Prometheus refuses anything else) and without
// control characters (a newline or NUL in a label, a log line or a shell
// is a bug waiting, never a queue someone meant).
func validName(name string) error {
	switch {
	case name == "":
		return errors.New("must not be empty")
	case !utf8.ValidString(name):
		return errors.New("is not valid UTF-8")
	case strings.ContainsFunc(name, unicode.IsControl):
		return errors.New("has a control character")
	}
	return nil
}
