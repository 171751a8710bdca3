// Package pgstore keeps idempotency records in a PostgreSQL table: an
// idempotency.Backend for the middleware and Once, and OnceTx, which writes
// the record in the caller's transaction so that the business write and the
// record commit (or roll back) together.
//
//	store := pgstore.New(pool, idempotency.WithRetention(24*time.Hour))
//	if err := store.CreateTable(ctx); err != nil { ... } // or run Schema in a migration
//	http.Handle("/charges", idempotency.Middleware(store)(charges))
//
//	// A worker: the charge and its record in one transaction.
//	tx, _ := pool.Begin(ctx)
//	defer tx.Rollback(ctx)
//	res, err := store.OnceTx(ctx, tx, "charges", job.ID, job.ID, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
//		_, err := tx.Exec(ctx, "INSERT INTO charges (order_id, cents) VALUES ($1, $2)", job.OrderID, job.Cents)
//		return []byte("charged"), err
//	})
//	if err == nil { err = tx.Commit(ctx) }
//
// # The record in SQL
//
// One row per (scope, key), the table's primary key: the UNIQUE that makes
// a second record for a key impossible whatever the callers do. Its
// columns are the fields of the Redis hash (contract/scripts/idempotency.lua):
// state (in_progress, completed), token (the owner's), lease_until (the
// end of the owner's lease), request (the request's fingerprint), and once
// completed status, headers (jsonb), body (bytea), too_large, truncated;
// expires_at ends the retention (a row past it counts as absent; Purge
// deletes such rows).
//
// Every claim (Begin, OnceTx) is one statement: a call of the table's
// <table>_begin_v1, the function Schema creates
// (contract/scripts/idempotency.sql, which every language's store runs),
// in its own transaction or OnceTx's savepoint. It first takes
// pg_try_advisory_xact_lock on a 64-bit hash of the table, scope and key,
// then reads the row FOR UPDATE and decides as the script does: absent or
// expired (insert: started), in progress past lease_until (taken over),
// in progress (in_progress, the seconds left of the lease), completed (the
// stored response), another fingerprint (conflict). The row is written with
// INSERT … ON CONFLICT (scope, key) DO UPDATE. While another transaction
// holds the key's lock a claim answers in progress without reading the row,
// even when the record is complete or another request's: the client's
// retry (Retry-After: 1) gets the replay or the conflict.
//
// Begin commits its row at once (state in_progress with a lease), as the
// Redis store does: Complete and Fail are single UPDATE/DELETE statements
// guarded by the owner's token (WHERE state = 'in_progress' AND token = $t),
// so a late owner whose key was taken over changes nothing (ErrLeaseLost).
//
// OnceTx holds its advisory lock until the caller's transaction ends, and
// its in_progress row is never visible to anyone else: it is completed in
// the same transaction, so others see either no record or the completed
// one. A duplicate meanwhile (another OnceTx, or Begin through the
// middleware) fails to take the lock and is answered in_progress (HTTP
// 409) at once instead of waiting on the row; a caller that bypasses the
// lock still meets the primary key and waits for the first transaction to
// end. A crashed worker's transaction rolls back: nothing to take over,
// the lease plays no part.
package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/backstop-dev/backstop/contract"
	"github.com/backstop-dev/backstop/idempotency"
)

// DefaultTable is the table's name unless WithTable says otherwise.
const DefaultTable = "backstop_idempotency"

// Schema returns the DDL of the table and of the function that decides its
// claims (contract/scripts/idempotency.sql, the one every language's store
// runs: CREATE TABLE IF NOT EXISTS, its expiry index, CREATE OR REPLACE
// FUNCTION), table quoted as an identifier; run it in a migration or
// through CreateTable, and again after an upgrade (the table and its rows
// stay as they are).
func Schema(table string) string {
	return strings.NewReplacer("{table}", pgx.Identifier{table}.Sanitize(),
		"{index}", pgx.Identifier{table + "_expires_at"}.Sanitize(),
		"{function}", beginFunction(table),
		"{name}", "'"+strings.ReplaceAll(table, "'", "''")+"'").Replace(contract.IdempotencySQL)
}

// beginFunction is the quoted name of table's claim function.
func beginFunction(table string) string { return pgx.Identifier{table + "_begin_v1"}.Sanitize() }

// DB is what the store runs its statements on: a *pgxpool.Pool, a
// *pgx.Conn (not shared between goroutines), or a pgx.Tx (the store's
// transactions are then savepoints of it).
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Store keeps idempotency records in a PostgreSQL table. Build it with New;
// it is safe for concurrent use when db is (a pool).
type Store struct {
	db    DB
	cfg   idempotency.Config
	table string // quoted
	name  string
}

// New returns a store over db with idempotency's options (WithLease,
// WithRetention, WithMaxBody, WithMetrics, WithLogger; WithPrefix is
// Redis's and ignored). The table must exist (Schema, CreateTable).
//
// # Errors
//
// Invalid options surface from the first call (Begin, OnceTx), naming the
// option.
func New(db DB, opts ...idempotency.Option) *Store {
	return &Store{db: db, cfg: idempotency.NewConfig(opts...), table: pgx.Identifier{DefaultTable}.Sanitize(), name: DefaultTable}
}

// WithTable returns a copy of the store on table name (a plain identifier,
// quoted by the store; for another schema set search_path). Default
// DefaultTable.
func (s *Store) WithTable(name string) *Store {
	c := *s
	c.table, c.name = pgx.Identifier{name}.Sanitize(), name
	return &c
}

// Config implements idempotency.Backend.
func (s *Store) Config() idempotency.Config { return s.cfg }

// CreateTable runs Schema for the store's table.
func (s *Store) CreateTable(ctx context.Context) error {
	if _, err := s.db.Exec(ctx, Schema(s.name)); err != nil {
		return fmt.Errorf("idempotency: create table %s: %w", s.table, err)
	}
	return nil
}

// Purge deletes up to limit rows past their retention and returns how
// many it deleted; run it periodically (a row past its retention already
// counts as absent: Purge only reclaims the space).
func (s *Store) Purge(ctx context.Context, limit int) (int64, error) {
	tag, err := s.db.Exec(ctx, `DELETE FROM `+s.table+` WHERE ctid IN (SELECT ctid FROM `+s.table+
		` WHERE expires_at <= clock_timestamp() LIMIT $1)`, limit)
	if err != nil {
		return 0, fmt.Errorf("idempotency: purge %s: %w", s.table, err)
	}
	return tag.RowsAffected(), nil
}

func (s *Store) check() error {
	if err := s.cfg.Check(); err != nil {
		return err
	}
	if s.name == "" {
		return errors.New("idempotency: table must not be empty")
	}
	return nil
}

// word checks a token or a fingerprint as the script does: 1..128
// printable ASCII characters, no spaces.
func word(name, v string) error {
	if v == "" || len(v) > 128 {
		return fmt.Errorf("idempotency: %s must be 1..128 printable ASCII characters, got %d bytes", name, len(v))
	}
	for i := 0; i < len(v); i++ {
		if v[i] <= 0x20 || v[i] > 0x7e {
			return fmt.Errorf("idempotency: %s must be 1..128 printable ASCII characters, byte %d is %#x", name, i, v[i])
		}
	}
	return nil
}

// beginSQL claims a key: the table's function decides it, in one
// statement (idempotency.sql).
func (s *Store) beginSQL() string {
	return `SELECT state, retry_after_s, taken_over, status, headers, body, too_large, truncated FROM ` +
		beginFunction(s.name) + `($1, $2, $3, $4, $5, $6)`
}

// claim decides a Begin on q (a pool: one statement, its own transaction;
// or OnceTx's savepoint). On Started the row is written as in_progress with
// token.
func (s *Store) claim(ctx context.Context, q DB, scope, key, request, token string) (idempotency.Claim, error) {
	var (
		state        string
		retryS       int64
		takenOver    bool
		status       *int32
		headers      *string
		body         []byte
		large, trunc bool
	)
	err := q.QueryRow(ctx, s.beginSQL(), scope, key, request, token, s.cfg.Lease.Milliseconds(), s.cfg.Retention.Milliseconds()).
		Scan(&state, &retryS, &takenOver, &status, &headers, &body, &large, &trunc)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42883" { // undefined_function
			err = fmt.Errorf("%w (the store's DDL is older than the store: run CreateTable or Schema again)", err)
		}
		return idempotency.Claim{}, err
	}
	switch state {
	case "conflict":
		return idempotency.Claim{State: idempotency.Conflict}, nil
	case "in_progress":
		return idempotency.Claim{State: idempotency.InProgress, RetryAfter: time.Duration(retryS) * time.Second}, nil
	case "started":
		return idempotency.Claim{State: idempotency.Started, Token: token, TakenOver: takenOver}, nil
	case "completed":
	default:
		return idempotency.Claim{}, fmt.Errorf("%s answered %q", beginFunction(s.name), state)
	}
	r := &idempotency.Response{TooLarge: large, Truncated: trunc, Headers: map[string][]string{}, Body: []byte{}}
	if status != nil {
		r.Status = int(*status)
	}
	if !large {
		if body != nil {
			r.Body = body
		}
		if headers != nil && *headers != "" {
			if err := json.Unmarshal([]byte(*headers), &r.Headers); err != nil {
				return idempotency.Claim{}, fmt.Errorf("stored headers are not a JSON object of lists: %w", err)
			}
		}
		r.Headers = idempotency.SafeHeaders(r.Headers, nil)
	}
	return idempotency.Claim{State: idempotency.Completed, Response: r}, nil
}

// Begin claims key (within scope) for a request whose fingerprint is
// request, in a transaction of its own that commits the in_progress row
// with its lease (see the package doc). It implements idempotency.Backend.
//
// # Errors
//
// A key idempotency.CheckKey refuses, bad options, or PostgreSQL failing
// (counted in the store errors metric).
func (s *Store) Begin(ctx context.Context, scope, key, request string) (idempotency.Claim, error) {
	if err := idempotency.CheckKey(key); err != nil {
		return idempotency.Claim{}, err
	}
	if err := s.check(); err != nil {
		return idempotency.Claim{}, err
	}
	if err := word("request", request); err != nil {
		return idempotency.Claim{}, err
	}
	c, err := s.claim(ctx, s.db, scope, key, request, idempotency.NewToken())
	if err != nil {
		s.cfg.Metrics.CountStoreError("begin")
		return idempotency.Claim{}, fmt.Errorf("idempotency: begin %q: %w", key, err)
	}
	if c.TakenOver {
		s.cfg.Metrics.CountLeaseExpiry()
	}
	return c, nil
}

// completeSQL stores the response; only the owner of a live record may.
func (s *Store) completeSQL() string {
	return `UPDATE ` + s.table + ` SET state = 'completed', status = $4, headers = $5, body = $6, too_large = $7,
  truncated = $8, lease_until = NULL, expires_at = clock_timestamp() + $9 * interval '1 millisecond'
WHERE scope = $1 AND key = $2 AND state = 'in_progress' AND token = $3 AND expires_at > clock_timestamp()`
}

func (s *Store) completeArgs(scope, key, token string, resp idempotency.Response) ([]any, error) {
	if resp.Status < 100 || resp.Status > 999 {
		return nil, fmt.Errorf("status must be a whole number in 100..999, got %d", resp.Status)
	}
	var headers, body any
	large := resp.TooLarge || len(resp.Body) > s.cfg.MaxBody
	if !large {
		h := idempotency.SafeHeaders(resp.Headers, s.cfg.Logger)
		j, err := json.Marshal(h)
		if err != nil {
			return nil, err
		}
		headers, body = string(j), resp.Body
		if resp.Body == nil {
			body = []byte{}
		}
	}
	return []any{scope, key, token, resp.Status, headers, body, large, resp.Truncated, s.cfg.Retention.Milliseconds()}, nil
}

// Complete stores resp as the key's response; only the owner (token from
// Begin) may, even past its lease when nobody took the key over. A body
// over the store's limit is stored as too large. It implements
// idempotency.Backend.
//
// # Errors
//
// idempotency.ErrLeaseLost (errors.Is) when the caller is no longer the
// owner: nothing was written.
func (s *Store) Complete(ctx context.Context, scope, key, token string, resp idempotency.Response) error {
	if err := word("token", token); err != nil {
		return err
	}
	args, err := s.completeArgs(scope, key, token, resp)
	if err != nil {
		return fmt.Errorf("idempotency: complete %q: %w", key, err)
	}
	tag, err := s.db.Exec(ctx, s.completeSQL(), args...)
	return s.ownerErr("complete", key, tag, err)
}

// Fail releases the key so that a retry may run (the row is deleted); only
// the owner may. It implements idempotency.Backend.
//
// # Errors
//
// idempotency.ErrLeaseLost (errors.Is) when the caller is no longer the
// owner.
func (s *Store) Fail(ctx context.Context, scope, key, token string) error {
	if err := word("token", token); err != nil {
		return err
	}
	tag, err := s.db.Exec(ctx, `DELETE FROM `+s.table+
		` WHERE scope = $1 AND key = $2 AND state = 'in_progress' AND token = $3 AND expires_at > clock_timestamp()`, scope, key, token)
	return s.ownerErr("fail", key, tag, err)
}

func (s *Store) ownerErr(op, key string, tag pgconn.CommandTag, err error) error {
	if err != nil {
		s.cfg.Metrics.CountStoreError(op)
		return fmt.Errorf("idempotency: %s %q: %w", op, key, err)
	}
	if tag.RowsAffected() == 0 {
		s.cfg.Metrics.CountLeaseLost()
		return fmt.Errorf("idempotency: %s %q: %w: the record is gone, completed, or owned by another caller", op, key, idempotency.ErrLeaseLost)
	}
	return nil
}

// Once runs fn at most once for key, with the record in its own
// transactions (Begin, then Complete or Fail): idempotency.Once on this
// store. Use OnceTx when fn writes to the same database.
func (s *Store) Once(ctx context.Context, scope, key, request string, fn func(context.Context) ([]byte, error)) ([]byte, error) {
	return idempotency.Once(ctx, s, scope, key, request, fn)
}

// OnceTx runs fn at most once for key (within scope), with the record
// written in tx, the caller's transaction: fn's writes (on the tx it is
// given) and the record commit together when the caller commits tx, or
// neither does. A later call with the same key and request gets fn's
// result without running it.
//
// fn runs in a savepoint of tx: when fn returns an error (or panics) the
// savepoint is rolled back, its writes and the claim with it, and tx is
// still usable. The key's advisory lock is held until tx ends.
//
// # Errors
//
// fn's error; *idempotency.InProgressError (another transaction holds the
// key, or a Begin's lease is live), idempotency.ErrConflict,
// idempotency.ErrTooLarge (errors.Is, errors.As); PostgreSQL's errors.
//
// # Notes
//
// Unlike Once there is no lease to outlive: the record becomes visible
// completed, at commit, or never. Commit tx promptly: duplicates are
// answered in progress until it ends.
func (s *Store) OnceTx(ctx context.Context, tx pgx.Tx, scope, key, request string, fn func(context.Context, pgx.Tx) ([]byte, error)) (out []byte, err error) {
	if err := idempotency.CheckKey(key); err != nil {
		return nil, err
	}
	if err := s.check(); err != nil {
		return nil, err
	}
	if err := word("request", request); err != nil {
		return nil, err
	}
	m := s.cfg.Metrics
	sp, err := tx.Begin(ctx)
	if err != nil {
		m.CountStoreError("begin")
		return nil, fmt.Errorf("idempotency: begin %q: %w", key, err)
	}
	committed := false
	defer func() {
		if !committed {
			sp.Rollback(context.WithoutCancel(ctx))
		}
	}()
	token := idempotency.NewToken()
	c, err := s.claim(ctx, sp, scope, key, request, token)
	if err != nil {
		m.CountStoreError("begin")
		return nil, fmt.Errorf("idempotency: begin %q: %w", key, err)
	}
	switch c.State {
	case idempotency.Conflict:
		m.CountRequest("conflict")
		return nil, fmt.Errorf("%w: %q", idempotency.ErrConflict, key)
	case idempotency.InProgress:
		m.CountRequest("in_progress")
		return nil, &idempotency.InProgressError{Key: key, RetryAfter: c.RetryAfter}
	case idempotency.Completed:
		if c.Response.TooLarge {
			m.CountRequest("too_large")
			return nil, fmt.Errorf("%w: %q", idempotency.ErrTooLarge, key)
		}
		m.CountRequest("replayed")
		return c.Response.Body, nil
	}
	if c.TakenOver {
		m.CountLeaseExpiry()
	}
	m.CountRequest("first_run")
	out, err = fn(ctx, sp)
	if err != nil {
		return nil, err
	}
	args, err := s.completeArgs(scope, key, token, idempotency.Response{Status: 200, Body: out})
	if err != nil {
		return nil, fmt.Errorf("idempotency: complete %q: %w", key, err)
	}
	tag, err := sp.Exec(ctx, s.completeSQL(), args...)
	if err = s.ownerErr("complete", key, tag, err); err != nil {
		return nil, err
	}
	if err := sp.Commit(ctx); err != nil {
		m.CountStoreError("complete")
		return nil, fmt.Errorf("idempotency: complete %q: %w", key, err)
	}
	committed = true
	return out, nil
}

var _ idempotency.Backend = (*Store)(nil)
