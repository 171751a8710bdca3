package idempotency

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"time"
)

// Backend keeps idempotency records: Middleware and Once run on any
// Backend. The Redis Store (New) is one; pgstore.Store (package
// idempotency/pgstore) keeps them in a PostgreSQL table, optionally in the
// caller's transaction. Every Backend answers testdata/idempotency the same
// way: what Begin, Complete and Fail do is the contract's script
// contract/scripts/idempotency.lua, whatever the storage.
//
// # Notes
//
// Begin returns a Claim; only its owner (Token) may Complete or Fail, even
// past its lease when nobody took the key over. Complete and Fail by
// anyone else return an error that errors.Is ErrLeaseLost and write
// nothing. A Backend counts its own calls (store errors, lease expiries,
// lease lost) in Config().Metrics, through Metrics' Count methods.
type Backend interface {
	Begin(ctx context.Context, scope, key, request string) (Claim, error)
	Complete(ctx context.Context, scope, key, token string, resp Response) error
	Fail(ctx context.Context, scope, key, token string) error
	// Config is what the backend was built with: Middleware and Once read
	// the lease, the metrics and the logger from it.
	Config() Config
}

// Config is the part of a Backend's configuration that Middleware and
// Once share with it. Build it with NewConfig from the same Options every
// backend takes (WithLease, WithRetention, WithMaxBody, WithMetrics,
// WithLogger).
type Config struct {
	// Lease is how long a started request owns its key.
	Lease time.Duration
	// Retention is how long a record is kept.
	Retention time.Duration
	// MaxBody is the largest response body stored.
	MaxBody int
	// Metrics are the counters; never nil.
	Metrics *Metrics
	// Logger is never nil.
	Logger *slog.Logger
}

// NewConfig applies opts over the defaults (lease 30s, retention 24h, max
// body 1 MiB, DefaultMetrics, slog.Default()). Options a backend does not
// use (WithPrefix for PostgreSQL) are ignored by it.
func NewConfig(opts ...Option) Config {
	o := defaults(opts)
	return Config{Lease: o.lease, Retention: o.retention, MaxBody: o.maxBody, Metrics: o.metrics, Logger: o.log}
}

func defaults(opts []Option) options {
	o := options{prefix: "idem", lease: 30 * time.Second, retention: 24 * time.Hour, maxBody: 1 << 20}
	for _, f := range opts {
		f(&o)
	}
	if o.metrics == nil {
		o.metrics = DefaultMetrics
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	return o
}

// Check says why c cannot run a store, or nil.
func (c Config) Check() error {
	return options{prefix: "idem", lease: c.Lease, retention: c.Retention, maxBody: c.MaxBody}.check()
}

// NewToken returns a fresh owner token (32 hex digits) for a Claim, for
// Backend implementations.
func NewToken() string {
	tok := make([]byte, 16)
	rand.Read(tok)
	return hex.EncodeToString(tok)
}
