package exporter

import (
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/backstop-dev/backstop/queue/redisqueue/rediskeys"
)

// defaultGroup is the consumer group reported when a Queue names none: the
// group the queue package's workers use.
const defaultGroup = "workers"

// Queue is one queue to report: its name (the queue label), its keys and
// the consumer groups of its jobs stream read in the scrape's first
// pipeline. Every other group of the stream is reported too, read in a
// second pipeline once XINFO GROUPS has named it.
//
// An empty key is not read: a layout without a delayed set, say, reports
// no delayed metrics. Groups defaults to ["workers"] when empty.
type Queue struct {
	Name   string
	Keys   rediskeys.Keys
	Groups []string
}

// QueueFor returns queue name in the default layout (rediskeys.For) with
// the group "workers".
func QueueFor(name string) Queue {
	return Queue{Name: name, Keys: rediskeys.For(name), Groups: []string{defaultGroup}}
}

// withDefaults returns q with its defaults filled in, or an error naming
// what is wrong.
func (q Queue) withDefaults() (Queue, error) {
	if q.Name == "" {
		return q, errors.New("queue name must not be empty")
	}
	if err := validName(q.Name); err != nil { // it becomes a label value
		return q, fmt.Errorf("queue name %q %w", q.Name, err)
	}
	if len(q.Groups) == 0 {
		q.Groups = []string{defaultGroup}
	}
	for _, g := range q.Groups {
		if err := validName(g); err != nil {
			return q, fmt.Errorf("queue %s: group name %q %w", q.Name, g, err)
		}
	}
	return q, nil
}

// queuesFile is the --queues.config file.
type queuesFile struct {
	Queues []queueEntry `yaml:"queues"`
}

type queueEntry struct {
	Name   string    `yaml:"name"`
	Keys   keysEntry `yaml:"keys"`
	Groups []string  `yaml:"groups"`
}

// keysEntry holds pointers so an unset key (default layout) differs from a
// key set to "" (not read).
type keysEntry struct {
	Jobs    *string `yaml:"jobs"`
	Delayed *string `yaml:"delayed"`
	DLQ     *string `yaml:"dlq"`
	Stats   *string `yaml:"stats"`
}

// LoadQueuesConfig reads the queues of a YAML file:
//
//	queues:
//	  - name: orders              # default layout {orders}:jobs, group workers
//	  - name: legacy
//	    keys: {jobs: "jobs:main", delayed: "delayed:retries", dlq: "jobs:dlq", stats: ""}
//	    groups: [workers, audit]
//
// A key left out takes its default-layout name ({name}:jobs, …); a key set
// to "" is not read. Groups defaults to [workers].
//
// # Errors
//
// The file is strict: an unknown field is an error that names it and its
// line, and so are a queue without a name, a name given twice and an empty
// file.
func LoadQueuesConfig(path string) ([]Queue, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("queues config: %w", err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	var file queuesFile
	if err := dec.Decode(&file); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("queues config %s: empty file, want a list under queues:", path)
		}
		var te *yaml.TypeError
		if errors.As(err, &te) { // one line, each problem naming its field and line
			msg := strings.Join(te.Errors, "; ")
			return nil, fmt.Errorf("queues config %s: %s", path, goType.ReplaceAllString(msg, ""))
		}
		return nil, fmt.Errorf("queues config %s: %w", path, err)
	}
	if len(file.Queues) == 0 {
		return nil, fmt.Errorf("queues config %s: no queues under queues:", path)
	}
	qs := make([]Queue, 0, len(file.Queues))
	for i, e := range file.Queues {
		q := QueueFor(e.Name)
		set(&q.Keys.Jobs, e.Keys.Jobs)
		set(&q.Keys.Delayed, e.Keys.Delayed)
		set(&q.Keys.DLQ, e.Keys.DLQ)
		set(&q.Keys.Stats, e.Keys.Stats)
		if e.Groups != nil {
			q.Groups = e.Groups
		}
		if _, err := q.withDefaults(); err != nil {
			return nil, fmt.Errorf("queues config %s: queues[%d]: %w", path, i, err)
		}
		qs = append(qs, q)
	}
	if err := checkUnique(qs); err != nil {
		return nil, fmt.Errorf("queues config %s: %w", path, err)
	}
	return qs, nil
}

// goType matches the Go type yaml names in its errors, which means nothing
// to the file's author.
var goType = regexp.MustCompile(` in type [\w.]+`)

func set(dst *string, v *string) {
	if v != nil {
		*dst = *v
	}
}

func checkUnique(qs []Queue) error {
	seen := make(map[string]bool, len(qs))
	for _, q := range qs {
		if seen[q.Name] {
			return fmt.Errorf("queue %s given twice", q.Name)
		}
		seen[q.Name] = true
	}
	return nil
}
