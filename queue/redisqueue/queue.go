// Package redisqueue is the Redis queue contract of backstop: jobs in a stream
// with a consumer group, cold retries in a delayed sorted set, dead letters
// in a stream, counters in a hash. Every move between them is one atomic
// Lua script that also acknowledges the source entry, and the attempt
// count lives in Redis, so a crash at any point loses nothing.
package redisqueue

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/redisqueue/rediskeys"

	"github.com/redis/go-redis/v9"
)

// Keys names the Redis keys of one queue (package rediskeys: the layout
// without the client). KeysFor gives the default layout, where every key
// shares the hash tag {name} so the scripts work on a Redis Cluster; set
// the fields by hand to drive an existing layout (keys of one queue must
// still hash to one slot on a cluster).
type Keys = rediskeys.Keys

// KeysFor returns the default keys of queue name: {name}:jobs, {name}:delayed,
// {name}:dlq and {name}:stats.
func KeysFor(name string) Keys { return rediskeys.For(name) }

// Queue is one queue in Redis. It is safe for concurrent use.
type Queue struct {
	rdb   redis.UniversalClient
	name  string
	keys  Keys
	group string
}

// Option configures a Queue.
type Option func(*Queue)

// WithKeys overrides the default key layout.
func WithKeys(k Keys) Option { return func(q *Queue) { q.keys = k } }

// WithGroup sets the consumer group (default "workers").
func WithGroup(g string) Option { return func(q *Queue) { q.group = g } }

// New returns the queue called name over a client: a plain client, a
// Sentinel failover client or a cluster client.
func New(rdb redis.UniversalClient, name string, opts ...Option) *Queue {
	q := &Queue{rdb: rdb, name: name, keys: KeysFor(name), group: "workers"}
	for _, o := range opts {
		o(q)
	}
	return q
}

// Name returns the queue's name.
func (q *Queue) Name() string { return q.name }

// Keys returns the queue's keys.
func (q *Queue) Keys() Keys { return q.keys }

// Group returns the consumer group.
func (q *Queue) Group() string { return q.group }

// EnsureGroup creates the jobs stream and its consumer group when missing.
func (q *Queue) EnsureGroup(ctx context.Context) error {
	err := q.rdb.XGroupCreateMkStream(ctx, q.keys.Jobs, q.group, "0").Err()
	if err == nil || strings.Contains(err.Error(), "BUSYGROUP") {
		return nil
	}
	// Redis refuses XGROUP CREATE before it looks for the group when it
	// refuses writes (out of memory, a read-only replica): a group that
	// exists is all a worker needs.
	if groups, gerr := q.rdb.XInfoGroups(ctx, q.keys.Jobs).Result(); gerr == nil {
		for _, g := range groups {
			if g.Name == q.group {
				return nil
			}
		}
	}
	return fmt.Errorf("queue %s: create group %s: %w", q.name, q.group, err)
}

// EnqueueOption configures one Enqueue.
type EnqueueOption func(*enqueueArgs)

type enqueueArgs struct{ jobType string }

// WithJobType gives the job a type (default, or "": untyped), 1..64 bytes of
// [A-Za-z0-9_./-]: the stats hash counts its outcomes per type
// (t:<type>:...), and Work decides it with the policy WithPolicies maps the
// type to. It travels with the job through every move.
func WithJobType(t string) EnqueueOption { return func(a *enqueueArgs) { a.jobType = t } }

// Enqueue adds a job. id is its stable identity (the idempotency key a
// downstream can deduplicate on); the server's clock stamps the first
// enqueue time. It returns the stream entry id.
//
// # Errors
//
// A job type that is not valid (see WithJobType) is refused before Redis.
func (q *Queue) Enqueue(ctx context.Context, id string, payload []byte, opts ...EnqueueOption) (string, error) {
	var a enqueueArgs
	for _, o := range opts {
		o(&a)
	}
	args := []any{id, payload}
	if a.jobType != "" {
		if err := queue.ValidJobType(a.jobType); err != nil {
			return "", fmt.Errorf("queue %s: enqueue %s: %w", q.name, id, err)
		}
		args = append(args, a.jobType)
	}
	v, err := scriptEnqueue.Run(ctx, q.rdb, []string{q.keys.Jobs, q.keys.Stats}, args...).Text()
	if err != nil {
		return "", fmt.Errorf("queue %s: enqueue %s: %w", q.name, id, err)
	}
	return v, nil
}

// Ack records a success: the entry is acknowledged and deleted and the
// outcome counted in one step. It reports false when the entry was no
// longer pending (another worker already moved it).
func (q *Queue) Ack(ctx context.Context, entryID string) (bool, error) {
	n, err := scriptAck.Run(ctx, q.rdb, []string{q.keys.Jobs, q.keys.Stats}, q.group, entryID).Int()
	if err != nil {
		return false, fmt.Errorf("queue %s: ack %s: %w", q.name, entryID, err)
	}
	return n == 1, nil
}

// Retry moves the job of entryID to the delayed set, due after delay by the
// server's clock, with its attempt count incremented; reason is the
// decision's reason (transient, retry_after, uncertain). It reports the
// due time, or false when the entry was no longer pending.
//
// # Errors
//
// A malformed entry (no job id, no valid attempt) is refused and left
// pending: dead-letter it with reason "malformed".
func (q *Queue) Retry(ctx context.Context, entryID string, delay time.Duration, reason, lastErr string) (time.Time, bool, error) {
	due, err := scriptRetry.Run(ctx, q.rdb, []string{q.keys.Jobs, q.keys.Delayed, q.keys.Stats},
		q.group, entryID, delay.Milliseconds(), reason, lastErr).Int64()
	if err != nil {
		return time.Time{}, false, fmt.Errorf("queue %s: retry %s: %w", q.name, entryID, err)
	}
	return time.UnixMilli(due), due != 0, nil
}

// Defer moves the job of entryID back to the delayed set, due after delay
// by the server's clock, with its attempt count unchanged: the policy
// refused to run it (reason circuit_open or budget_exhausted), which is no
// fault of the job, so it waits without spending an attempt. lastErr ""
// keeps the entry's last error. It reports the due time, or false when the
// entry was no longer pending.
//
// # Errors
//
// As Retry: a malformed entry is refused and left pending.
func (q *Queue) Defer(ctx context.Context, entryID string, delay time.Duration, reason, lastErr string) (time.Time, bool, error) {
	due, err := scriptDefer.Run(ctx, q.rdb, []string{q.keys.Jobs, q.keys.Delayed, q.keys.Stats},
		q.group, entryID, max(0, delay.Milliseconds()), reason, lastErr).Int64()
	if err != nil {
		return time.Time{}, false, fmt.Errorf("queue %s: defer %s: %w", q.name, entryID, err)
	}
	return time.UnixMilli(due), due != 0, nil
}

// DeadLetter moves the job of entryID to the dead letter stream with the
// reason and the last error. It returns the DLQ entry id, or "" when the
// entry was no longer pending.
func (q *Queue) DeadLetter(ctx context.Context, entryID, reason, lastErr string) (string, error) {
	v, err := scriptDeadLetter.Run(ctx, q.rdb, []string{q.keys.Jobs, q.keys.DLQ, q.keys.Stats},
		q.group, entryID, reason, lastErr).Result()
	if err != nil {
		return "", fmt.Errorf("queue %s: dead-letter %s: %w", q.name, entryID, err)
	}
	if s, ok := v.(string); ok {
		return s, nil
	}
	return "", nil
}

// Promote moves at most limit due jobs from the delayed set to the jobs
// stream. It returns how many moved and how long until the next one is due
// (-1 when the set is empty).
func (q *Queue) Promote(ctx context.Context, limit int) (int, time.Duration, error) {
	v, err := scriptPromote.Run(ctx, q.rdb, []string{q.keys.Delayed, q.keys.Jobs, q.keys.Stats}, limit).Int64Slice()
	if err != nil || len(v) != 2 {
		return 0, 0, fmt.Errorf("queue %s: promote: %w", q.name, errOr(err, "unexpected reply"))
	}
	next := time.Duration(v[1]) * time.Millisecond
	if v[1] < 0 {
		next = -1
	}
	return int(v[0]), next, nil
}

// Reclaimed is what Reclaim did.
type Reclaimed struct {
	// DeadLettered counts the crash loops moved to the DLQ (reason
	// crash_loop).
	DeadLettered int
	// Jobs are the entries now claimed for the consumer: process them as if
	// read.
	Jobs []queue.Job
	// Skipped are the crash loops the DLQ refused (a key of the wrong type,
	// an entry too large for it, Redis out of memory): they stay pending,
	// their idle time reset, and are tried again after the min idle time.
	Skipped []Skipped
}

// Skipped is an entry Reclaim could not move, and why.
type Skipped struct {
	EntryID string
	Reason  string
}

// Reclaim takes over at most count entries pending longer than minIdle for
// consumer. Entries already delivered maxDeliveries times go to the DLQ with
// reason crash_loop instead; one the DLQ refuses is skipped, so that no
// entry can stop the others from being reclaimed.
func (q *Queue) Reclaim(ctx context.Context, consumer string, minIdle time.Duration, count, maxDeliveries int) (Reclaimed, error) {
	v, err := scriptReclaim.Run(ctx, q.rdb, []string{q.keys.Jobs, q.keys.DLQ, q.keys.Stats},
		q.group, consumer, minIdle.Milliseconds(), count, maxDeliveries).Slice()
	if err == nil && len(v) != 3 {
		err = fmt.Errorf("unexpected reply of %d elements", len(v))
	}
	if err != nil {
		return Reclaimed{}, fmt.Errorf("queue %s: reclaim: %w", q.name, err)
	}
	var r Reclaimed
	dead, _ := v[0].(int64)
	r.DeadLettered = int(dead)
	claimed, _ := v[1].([]any)
	for _, raw := range claimed {
		if j, ok := jobFromReply(raw); ok {
			r.Jobs = append(r.Jobs, j)
		}
	}
	skipped, _ := v[2].([]any)
	for _, raw := range skipped {
		if s, ok := raw.([]any); ok && len(s) == 2 {
			id, _ := s[0].(string)
			why, _ := s[1].(string)
			r.Skipped = append(r.Skipped, Skipped{EntryID: id, Reason: why})
		}
	}
	return r, nil
}

// ReplayOption narrows what Replay moves.
type ReplayOption func(*replayArgs)

type replayArgs struct {
	jobType string
	set     bool
}

// ReplayJobType replays only the dead letters of job type t.
func ReplayJobType(t string) ReplayOption {
	return func(a *replayArgs) { a.jobType, a.set = t, true }
}

// Replay moves at most limit dead letters (only those with reason, unless
// reason is "", and of the job type ReplayJobType names) back to the jobs
// stream with the attempt count reset, in bounded batches. It returns how
// many moved.
func (q *Queue) Replay(ctx context.Context, limit int, reason string, opts ...ReplayOption) (int, error) {
	// As the Node and Python queues do: a limit below 1 is a mistake, not
	// "replay nothing" (testdata/queue: replay/bad-limit-0).
	if limit < 1 {
		return 0, fmt.Errorf("queue %s: replay: limit must be at least 1, got %d", q.name, limit)
	}
	var a replayArgs
	for _, o := range opts {
		o(&a)
	}
	if a.set {
		if err := queue.ValidJobType(a.jobType); err != nil {
			return 0, fmt.Errorf("queue %s: replay: %w", q.name, err)
		}
	}
	return q.ReplayDeadLetters(ctx, ReplayOptions{Limit: limit, Reason: reason, JobType: a.jobType})
}

// batchReply reads the reply of a script that works a stream or set in
// bounded calls (replay, discard, run by id): {moved, next cursor}, the
// cursor "0" (or "") when the scan is done.
func batchReply(v []any, err error) (moved int, cursor string, done bool, _ error) {
	if err == nil && len(v) != 2 {
		err = fmt.Errorf("unexpected reply of %d elements", len(v))
	}
	if err != nil {
		return 0, "", true, err
	}
	n, _ := v[0].(int64)
	cursor, _ = v[1].(string)
	return int(n), cursor, cursor == "0" || cursor == "", nil
}

func errOr(err error, msg string) error {
	if err != nil {
		return err
	}
	return errors.New(msg)
}

func jobFromMessage(m redis.XMessage) queue.Job {
	j := queue.Job{EntryID: m.ID}
	str := func(k string) string { s, _ := m.Values[k].(string); return s }
	if plain(m.Values) {
		return plainJob(m, str)
	}
	j.ID = str("id")
	j.Payload = []byte(str("payload"))
	j.LastError, j.LastReason = str("last_error"), str("last_reason")
	j.Type = str("type")
	a, f := str("attempt"), str("first_enqueued_ms")
	j.Attempt, _ = strconv.ParseInt(a, 10, 64)
	j.FirstEnqueuedMs, _ = strconv.ParseInt(f, 10, 64)
	j.PrevDelayMs, _ = strconv.ParseInt(str("prev_delay_ms"), 10, 64)
	j.DueMs, _ = strconv.ParseInt(str("due_ms"), 10, 64)
	// The same rule as retry.lua: digits, attempt in 1..1e14.
	j.Malformed = j.ID == "" || !digits(a) || a[0] == '0' || len(a) > 14 || !digits(f)
	return j
}

// plain reports an entry written by a producer that knows nothing of
// backstop: none of the fields a backstop job or a malformed delayed member
// has (queue/redisqueue/README.md, "Plain producers").
func plain(v map[string]any) bool {
	for _, k := range []string{"id", "attempt", "first_enqueued_ms", "malformed_delayed_member"} {
		if _, ok := v[k]; ok {
			return false
		}
	}
	return true
}

// plainJob is the job of a plain entry, as lib.lua's plain_job makes it:
// attempt 1, the entry's id and time, the payload field or else the fields
// JSON.
func plainJob(m redis.XMessage, str func(string) string) queue.Job {
	j := queue.Job{EntryID: m.ID, ID: m.ID, Attempt: 1, Type: str("type")}
	ms, _, _ := strings.Cut(m.ID, "-")
	t, err := strconv.ParseInt(ms, 10, 64)
	j.FirstEnqueuedMs = t
	j.Malformed = err != nil || t > maxSafeMs
	if _, ok := m.Values["payload"]; ok {
		j.Payload = []byte(str("payload"))
	} else {
		j.Payload = fieldsJSON(m.Values)
	}
	return j
}

// maxSafeMs is the largest time a plain entry's id may carry: 2^53-1, the
// largest whole number every host reads exactly.
const maxSafeMs = 1<<53 - 1

// fieldsJSON is the payload a plain entry without a payload field runs with:
// a JSON object of its fields (each name's last value), names in byte order,
// no spaces, only \, " and bytes below 0x20 escaped (\u00xx); every other
// byte as it is, so the same entry gives the same bytes in every language.
func fieldsJSON(v map[string]any) []byte {
	names := make([]string, 0, len(v))
	for k := range v {
		names = append(names, k)
	}
	sort.Strings(names)
	b := []byte{'{'}
	for i, k := range names {
		if i > 0 {
			b = append(b, ',')
		}
		s, _ := v[k].(string)
		b = append(appendQuoted(b, k), ':')
		b = appendQuoted(b, s)
	}
	return append(b, '}')
}

func appendQuoted(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' || c == '"':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

const hexDigits = "0123456789abcdef"

func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// jobFromReply decodes an entry from a script reply: [id, [k, v, ...]].
func jobFromReply(raw any) (queue.Job, bool) {
	e, ok := raw.([]any)
	if !ok || len(e) != 2 {
		return queue.Job{}, false
	}
	id, _ := e[0].(string)
	fields, _ := e[1].([]any)
	m := redis.XMessage{ID: id, Values: map[string]any{}}
	for i := 0; i+1 < len(fields); i += 2 {
		k, _ := fields[i].(string)
		m.Values[k] = fields[i+1]
	}
	return jobFromMessage(m), true
}
