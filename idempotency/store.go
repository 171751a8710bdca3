// Package idempotency is the server side of idempotency keys: a store that
// answers a retried request with the first one's response instead of
// running it twice, net/http middleware and the worker's Once over it. The
// store is a Backend: Store (New) keeps the records in Redis,
// idempotency/pgstore in a PostgreSQL table, optionally in the caller's
// transaction.
//
// Every call is one run of the contract's script contract/scripts/idempotency.lua
// (queue/redisqueue/README.md, "Idempotency keys"), the one the Node.js and Python
// adapters run too; testdata/idempotency pins what it answers.
//
//	store := idempotency.New(rdb, idempotency.WithRetention(24*time.Hour))
//	http.Handle("/charges", idempotency.Middleware(store)(charges))
package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/contract"
)

// MaxKeyLength is the longest idempotency key accepted, in bytes (Stripe's
// limit).
const MaxKeyLength = 255

// ErrLeaseLost is returned by Complete and Fail when the caller no longer
// owns the key: its lease ran out and another request took the key over, or
// the record expired. Nothing was written: the other run's result stands.
var ErrLeaseLost = errors.New("idempotency: lease lost")

var script = func() *redis.Script {
	src, err := contract.ScriptSource("idempotency")
	if err != nil {
		panic(err)
	}
	return redis.NewScript(src)
}()

// State is what Begin found under a key.
type State int

const (
	// Started: the key was absent (or its owner's lease ran out); the caller
	// owns it and must Complete or Fail.
	Started State = iota
	// InProgress: another request holds the key; retry after RetryAfter.
	InProgress
	// Completed: Response is the first request's response.
	Completed
	// Conflict: the key was used for a different request.
	Conflict
)

func (s State) String() string {
	return [...]string{"started", "in_progress", "completed", "conflict"}[s]
}

// Response is a stored response. Headers are the selected ones only.
type Response struct {
	Status  int
	Headers map[string][]string
	Body    []byte
	// TooLarge: the response was over the store's limit and was not kept;
	// it cannot be replayed.
	TooLarge bool
	// Truncated: the client left before the response was finished; Body is
	// what was captured by then. A replay answers it as it is.
	Truncated bool
}

// Claim is the answer of Begin.
type Claim struct {
	State State
	// Token identifies the owner when State is Started.
	Token string
	// TakenOver: Started on a key whose previous owner's lease ran out.
	TakenOver bool
	// RetryAfter is the lease left when State is InProgress, whole seconds.
	RetryAfter time.Duration
	// Response when State is Completed.
	Response *Response
}

// Store keeps idempotency records in Redis: the Backend the package was
// built with. Build it with New; it is safe for concurrent use.
type Store struct {
	rdb redis.Scripter
	o   options
}

type options struct {
	prefix    string
	lease     time.Duration
	retention time.Duration
	maxBody   int
	metrics   *Metrics
	log       *slog.Logger
}

// Option configures a Store.
type Option func(*options)

// WithPrefix sets the key prefix: a record lives at "<prefix>:{<scope>:<key>}"
// (one hash tag, so the record and anything added beside it share a Cluster
// slot). Default "idem".
func WithPrefix(p string) Option { return func(o *options) { o.prefix = p } }

// WithLease sets how long a started request owns its key before another
// may take it over (a crashed request then blocks its key this long, not for
// the whole retention). Default 30s.
func WithLease(d time.Duration) Option { return func(o *options) { o.lease = d } }

// WithRetention sets how long a record is kept. Default 24h.
func WithRetention(d time.Duration) Option { return func(o *options) { o.retention = d } }

// WithMaxBody sets the largest response body stored; a larger one is
// recorded as too large to replay. Default 1 MiB.
func WithMaxBody(n int) Option { return func(o *options) { o.maxBody = n } }

// WithMetrics counts into m (NewMetrics) instead of the package's
// DefaultMetrics.
func WithMetrics(m *Metrics) Option { return func(o *options) { o.metrics = m } }

// WithLogger sets the logger of the store and of its Middleware and Once:
// a header name that cannot be stored, a store call that failed after the
// handler ran. Default slog.Default().
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// New returns a store over rdb (a *redis.Client, *redis.ClusterClient or any
// redis.Scripter). The client stays the caller's.
//
// # Errors
//
// Invalid options surface from the first call (Begin), naming the option.
func New(rdb redis.Scripter, opts ...Option) *Store {
	return &Store{rdb: rdb, o: defaults(opts)}
}

// Config implements Backend.
func (s *Store) Config() Config {
	return Config{Lease: s.o.lease, Retention: s.o.retention, MaxBody: s.o.maxBody, Metrics: s.o.metrics, Logger: s.o.log}
}

func (s *Store) check() error { return s.o.check() }

func (o options) check() error {
	switch {
	case o.lease < time.Millisecond:
		return fmt.Errorf("idempotency: lease must be at least 1ms, got %v", o.lease)
	case o.retention < o.lease:
		return fmt.Errorf("idempotency: retention must be at least the lease (%v), got %v", o.lease, o.retention)
	case o.maxBody < 0:
		return fmt.Errorf("idempotency: max body must not be negative, got %d", o.maxBody)
	case o.prefix == "" || strings.ContainsAny(o.prefix, "{}"):
		return fmt.Errorf("idempotency: prefix must be non-empty without braces, got %q", o.prefix)
	}
	return nil
}

// CheckKey says why key cannot be an idempotency key, or nil: 1..255
// printable ASCII characters.
func CheckKey(key string) error {
	if key == "" {
		return errors.New("idempotency: key must not be empty")
	}
	if len(key) > MaxKeyLength {
		return fmt.Errorf("idempotency: key must be at most %d bytes, got %d", MaxKeyLength, len(key))
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return fmt.Errorf("idempotency: key must be printable ASCII, byte %d is %#x", i, key[i])
		}
	}
	return nil
}

// RecordKey returns the Redis key of key within scope.
func (s *Store) RecordKey(scope, key string) string {
	return s.o.prefix + ":{" + scope + ":" + key + "}"
}

func ms(d time.Duration) string { return fmt.Sprint(d.Milliseconds()) }

// Begin claims key (within scope) for a request whose fingerprint is
// request (a hash of what makes two requests the same: method, path, body).
//
// # Errors
//
// A key CheckKey refuses, bad options, or Redis failing (counted in the
// store errors metric).
func (s *Store) Begin(ctx context.Context, scope, key, request string) (Claim, error) {
	if err := CheckKey(key); err != nil {
		return Claim{}, err
	}
	if err := s.check(); err != nil {
		return Claim{}, err
	}
	token := NewToken()
	r, err := script.Run(ctx, s.rdb, []string{s.RecordKey(scope, key)},
		"begin", token, request, ms(s.o.lease), ms(s.o.retention)).Slice()
	if err != nil {
		s.o.metrics.storeErrors.WithLabelValues("begin").Inc()
		return Claim{}, fmt.Errorf("idempotency: begin %q: %w", key, err)
	}
	c, err := parseBegin(r)
	if err != nil {
		s.o.metrics.storeErrors.WithLabelValues("begin").Inc()
		return Claim{}, fmt.Errorf("idempotency: begin %q: %w", key, err)
	}
	if c.State == Started {
		c.Token = token
		if c.TakenOver {
			s.o.metrics.leaseExpiries.Inc()
		}
	}
	return c, nil
}

func parseBegin(r []any) (Claim, error) {
	str := func(i int) string { s, _ := r[i].(string); return s }
	num := func(i int) int64 { n, _ := r[i].(int64); return n }
	switch {
	case len(r) == 2 && str(0) == "started":
		return Claim{State: Started, TakenOver: num(1) == 1}, nil
	case len(r) == 2 && str(0) == "in_progress":
		return Claim{State: InProgress, RetryAfter: time.Duration(num(1)) * time.Second}, nil
	case len(r) == 1 && str(0) == "conflict":
		return Claim{State: Conflict}, nil
	case len(r) == 6 && str(0) == "completed":
		resp := &Response{TooLarge: num(4) == 1, Truncated: num(5) == 1}
		fmt.Sscan(str(1), &resp.Status)
		var err error
		if resp.Headers, resp.Body, err = decodeStored(str(2), str(3)); err != nil {
			return Claim{}, err
		}
		return Claim{State: Completed, Response: resp}, nil
	}
	return Claim{}, fmt.Errorf("unexpected reply %v", r)
}

// Complete stores resp as the key's response; only the owner (token from
// Begin) may. A body over the store's limit is stored as too large. Headers
// are stored as SafeHeader has them: a header whose name is not a token is
// dropped (logged once per name).
//
// # Errors
//
// ErrLeaseLost (errors.Is) when the caller is no longer the owner.
func (s *Store) Complete(ctx context.Context, scope, key, token string, resp Response) error {
	large, truncated := "0", "0"
	if resp.Truncated {
		truncated = "1"
	}
	headers, body := encodeStored(safeHeaders(resp.Headers, func(name string) { logDropped(s.o.log, name) }), resp.Body)
	if resp.TooLarge || len(resp.Body) > s.o.maxBody {
		large, headers, body = "1", "", ""
	}
	err := script.Run(ctx, s.rdb, []string{s.RecordKey(scope, key)},
		"complete", token, fmt.Sprint(resp.Status), headers, body, large, ms(s.o.retention), truncated).Err()
	return s.ownerErr("complete", key, err)
}

// Fail releases the key so that a retry may run; only the owner may.
//
// # Errors
//
// ErrLeaseLost (errors.Is) when the caller is no longer the owner.
func (s *Store) Fail(ctx context.Context, scope, key, token string) error {
	err := script.Run(ctx, s.rdb, []string{s.RecordKey(scope, key)}, "fail", token).Err()
	return s.ownerErr("fail", key, err)
}

func (s *Store) ownerErr(op, key string, err error) error {
	if err == nil {
		return nil
	}
	if strings.Contains(err.Error(), "backstop idempotency: lease lost") {
		s.o.metrics.leaseLost.Inc()
		return fmt.Errorf("idempotency: %s %q: %w: %v", op, key, ErrLeaseLost, err)
	}
	s.o.metrics.storeErrors.WithLabelValues(op).Inc()
	return fmt.Errorf("idempotency: %s %q: %w", op, key, err)
}
