package exporter

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/queue/redisqueue"
)

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "queues.yaml")
	must(t, os.WriteFile(path, []byte(text), 0o644))
	return path
}

func TestLoadQueuesConfig(t *testing.T) {
	qs, err := LoadQueuesConfig("testdata/queues.yaml")
	must(t, err)
	wantQs := []Queue{
		QueueFor("orders"),
		{Name: "legacy", Keys: redisqueue.Keys{Jobs: "jobs:main", Delayed: "delayed:retries", DLQ: "jobs:dlq"}, Groups: []string{"workers", "audit", "ghost"}},
		QueueFor("lagless"),
		QueueFor("fresh"),
	}
	if !reflect.DeepEqual(qs, wantQs) {
		t.Errorf("got %+v\nwant %+v", qs, wantQs)
	}
}

func TestLoadQueuesConfigErrors(t *testing.T) {
	for name, tc := range map[string]struct{ text, want string }{
		"unknown field":     {"queues:\n  - name: a\n    group: [x]\n", "queues.yaml: line 3: field group not found"},
		"unknown key field": {"queues:\n  - name: a\n    keys: {jobz: x}\n", "field jobz not found"},
		"unknown top field": {"queue:\n  - name: a\n", "field queue not found"},
		"no name":           {"queues:\n  - keys: {jobs: x}\n", "queues[0]: queue name must not be empty"},
		"empty group":       {"queues:\n  - name: a\n    groups: ['']\n", `queue a: group name "" must not be empty`},
		"control character": {"queues:\n  - name: \"a\\nb\"\n", `queue name "a\nb" has a control character`},
		"bad group":         {"queues:\n  - name: a\n    groups: [\"w\\x01\"]\n", `queue a: group name "w\x01" has a control character`},
		"twice":             {"queues:\n  - name: a\n  - name: a\n", "queue a given twice"},
		"empty file":        {"", "empty file"},
		"no queues":         {"queues: []\n", "no queues"},
		"not yaml":          {"queues: [", "yaml"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := LoadQueuesConfig(writeConfig(t, tc.text))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
	if _, err := LoadQueuesConfig(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Error("no error for a missing file")
	}
}

func TestNewCollectorErrors(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	t.Cleanup(func() { rdb.Close() })
	for name, tc := range map[string]struct {
		opts []Option
		want string
	}{
		"no queues":         {nil, "no queues"},
		"no name":           {[]Option{WithQueues(Queue{})}, "queue name must not be empty"},
		"twice":             {[]Option{WithQueues(QueueFor("a"), QueueFor("a"))}, "queue a given twice"},
		"timeout":           {[]Option{WithQueues(QueueFor("a")), WithTimeout(0)}, "timeout must be positive"},
		"pattern no tag":    {[]Option{WithPattern("*:jobs", time.Minute, 10)}, "no hash tag"},
		"pattern empty tag": {[]Option{WithPattern("{}:jobs", time.Minute, 10)}, "no hash tag"},
		"refresh":           {[]Option{WithPattern("{*}:jobs", 0, 10)}, "refresh interval must be positive"},
		"max keys":          {[]Option{WithPattern("{*}:jobs", time.Minute, 0)}, "max keys must be positive"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := NewCollector(rdb, tc.opts...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
	c, err := NewCollector(rdb, WithQueues(Queue{Name: "a"}))
	must(t, err)
	if g := c.cfg.queues[0].Groups; !reflect.DeepEqual(g, []string{"workers"}) {
		t.Errorf("default groups %v", g)
	}
}
