package exporter

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
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
	found   []string
	ok      bool          // found holds the result of a successful refresh
	at      time.Time     // when found was refreshed
	running chan struct{} // closed when the running refresh ends; nil when none runs
	err     error         // the last refresh's error, for the next scrape to report
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

// names returns the queue names found by the last successful refresh. It
// starts a refresh in the background when they are older than the
// interval, and waits for it (until ctx ends) only when there are none
// yet. The error is the last failed refresh's, reported once.
func (d *discovery) names(ctx context.Context) ([]string, error) {
	d.mu.Lock()
	if d.running == nil && (!d.ok || time.Since(d.at) >= d.every) {
		d.running = make(chan struct{})
		go d.refresh(d.running)
	}
	wait := d.running
	if d.ok {
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
	names, truncated, err := d.scan(ctx)
	d.mu.Lock()
	if err == nil {
		d.found, d.ok, d.at = names, true, time.Now()
	}
	d.err = err
	d.running = nil
	d.mu.Unlock()
	close(done)
	switch {
	case err != nil:
		d.log.Error("queue discovery failed", "pattern", d.pattern, "err", err)
	case truncated:
		d.log.Warn("queue discovery stopped at max keys", "pattern", d.pattern, "max_keys", d.max, "queues", len(names))
	default:
		d.log.Debug("queues discovered", "pattern", d.pattern, "queues", len(names), "took", time.Since(start))
	}
}

type scanner interface {
	Scan(ctx context.Context, cursor uint64, match string, count int64) *redis.ScanCmd
}

// scan SCANs every master (in parallel on a cluster) and returns the
// sorted, distinct hash-tag contents of at most max matching keys.
func (d *discovery) scan(ctx context.Context) (names []string, truncated bool, err error) {
	var mu sync.Mutex
	seen := map[string]bool{}
	keys := 0
	scanOne := func(ctx context.Context, c scanner) error {
		it := c.Scan(ctx, 0, d.pattern, 1000).Iterator()
		for it.Next(ctx) {
			mu.Lock()
			if keys >= d.max {
				truncated = true
				mu.Unlock()
				return nil
			}
			keys++
			if name, ok := hashTag(it.Val()); ok && utf8.ValidString(name) { // a label value
				seen[name] = true
			}
			mu.Unlock()
		}
		return it.Err()
	}
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
	if err != nil {
		return nil, false, fmt.Errorf("scan %q: %w", d.pattern, err)
	}
	for n := range seen {
		names = append(names, n)
	}
	slices.Sort(names)
	return names, truncated, nil
}

// hashTag returns the content of key's hash tag as Redis Cluster reads it:
// from the first '{' to the next '}', when not empty.
func hashTag(key string) (string, bool) {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return "", false
	}
	end := strings.IndexByte(key[open+1:], '}')
	if end <= 0 {
		return "", false
	}
	return key[open+1 : open+1+end], true
}
