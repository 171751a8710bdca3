package pgstore_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/backstop-dev/backstop/idempotency"
	"github.com/backstop-dev/backstop/idempotency/pgstore"
	"github.com/backstop-dev/backstop/internal/testing/idemcases"
	"github.com/backstop-dev/backstop/internal/testing/logbuf"
	"github.com/backstop-dev/backstop/internal/testing/pgtest"
)

func charges(t *testing.T, pool *pgxpool.Pool) func() int {
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE charges (id serial PRIMARY KEY, order_id text NOT NULL, cents int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM charges`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
}

// inTx runs f in a transaction of pool and commits it (rolls it back when
// f fails and rollback is set).
func inTx(t *testing.T, pool *pgxpool.Pool, f func(tx pgx.Tx) error) error {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := f(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// The charge and its record commit together: a redelivered job replays the
// result without a second charge; a rolled-back transaction leaves neither,
// so the job runs again.
func TestOnceTxCommitsTheWriteAndTheRecordTogether(t *testing.T) {
	ctx := context.Background()
	pool := start(t)
	count := charges(t, pool)
	m := idempotency.NewMetrics()
	store := pgstore.New(pool, idempotency.WithMetrics(m))
	runs := 0
	charge := func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		runs++
		_, err := tx.Exec(ctx, `INSERT INTO charges (order_id, cents) VALUES ('o1', 500)`)
		return []byte("charged"), err
	}
	for i := range 2 {
		var out []byte
		err := inTx(t, pool, func(tx pgx.Tx) (err error) {
			out, err = store.OnceTx(ctx, tx, "jobs", "j1", "j1", charge)
			return err
		})
		if err != nil || string(out) != "charged" || runs != 1 || count() != 1 {
			t.Fatalf("delivery %d: %q %v, %d runs, %d charges: want one run, one charge, its result twice", i+1, out, err, runs, count())
		}
	}
	// The caller rolls back after OnceTx succeeded: neither the charge nor
	// the record stays.
	tx, _ := pool.Begin(ctx)
	if _, err := store.OnceTx(ctx, tx, "jobs", "j2", "j2", charge); err != nil {
		t.Fatal(err)
	}
	tx.Rollback(ctx)
	if runs != 2 || count() != 1 {
		t.Fatalf("rolled back: %d runs, %d charges", runs, count())
	}
	// fn fails: its savepoint is rolled back, so even a caller that
	// commits anyway keeps neither its writes nor a record.
	boom := errors.New("card declined")
	err := inTx(t, pool, func(tx pgx.Tx) error {
		_, err := store.OnceTx(ctx, tx, "jobs", "j2", "j2", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			charge(ctx, tx)
			return nil, boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("failing fn: %v", err)
		}
		return nil // commit
	})
	if err != nil || count() != 1 {
		t.Fatalf("failed fn, committed: %v, %d charges", err, count())
	}
	if err := inTx(t, pool, func(tx pgx.Tx) error { _, err := store.OnceTx(ctx, tx, "jobs", "j2", "j2", charge); return err }); err != nil || count() != 2 {
		t.Fatalf("after a rollback and a failure, the job runs: %v, %d charges", err, count())
	}
	// Another request under j1.
	err = inTx(t, pool, func(tx pgx.Tx) error { _, err := store.OnceTx(ctx, tx, "jobs", "j1", "j1-other", charge); return err })
	if !errors.Is(err, idempotency.ErrConflict) {
		t.Errorf("another request under j1: %v, want ErrConflict", err)
	}
}

// While a transaction holds a key, a duplicate (another OnceTx, or the
// middleware's Begin on its own connection) is answered in progress at once
// instead of waiting on the row; after the commit it gets the result.
func TestOnceTxDuplicateWhileTheTransactionRuns(t *testing.T) {
	ctx := context.Background()
	pool := start(t)
	count := charges(t, pool)
	store := pgstore.New(pool, idempotency.WithMetrics(idempotency.NewMetrics()))
	var inner, begin error
	var claim idempotency.Claim
	err := inTx(t, pool, func(tx pgx.Tx) error {
		_, err := store.OnceTx(ctx, tx, "jobs", "j3", "j3", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			tx.Exec(ctx, `INSERT INTO charges (order_id, cents) VALUES ('o3', 100)`)
			inner = inTx(t, pool, func(tx2 pgx.Tx) error {
				_, err := store.OnceTx(ctx, tx2, "jobs", "j3", "j3", func(context.Context, pgx.Tx) ([]byte, error) {
					t.Error("the duplicate ran")
					return nil, nil
				})
				return err
			})
			claim, begin = store.Begin(ctx, "jobs", "j3", "j3")
			return []byte("first"), nil
		})
		return err
	})
	var ip *idempotency.InProgressError
	if err != nil || !errors.As(inner, &ip) || ip.RetryAfter != time.Second {
		t.Fatalf("first %v; duplicate OnceTx %v, want InProgressError (1s)", err, inner)
	}
	if begin != nil || claim.State != idempotency.InProgress {
		t.Fatalf("Begin while the transaction runs: %+v %v, want in_progress", claim, begin)
	}
	claim, err = store.Begin(ctx, "jobs", "j3", "j3")
	if err != nil || claim.State != idempotency.Completed || string(claim.Response.Body) != "first" || count() != 1 {
		t.Fatalf("after the commit: %+v %v, %d charges", claim, err, count())
	}
}

// The worker's Once without a transaction of the caller: the record in its
// own transactions, with a lease, as on Redis (the checks the Redis store's
// TestOnceRunsAJobOnce makes).
func TestOnceRunsAJobOnce(t *testing.T) {
	pool := start(t)
	idemcases.Once(t, pgstore.New(pool, idempotency.WithMetrics(idempotency.NewMetrics())))
}

// The middleware on PostgreSQL: replay, 422 on another body, 409 while the
// first runs, as on Redis.
func TestMiddleware(t *testing.T) {
	pool := start(t)
	store := pgstore.New(pool, idempotency.WithMetrics(idempotency.NewMetrics()))
	var runs atomic.Int64
	started, release := make(chan struct{}, 1), make(chan struct{})
	srv := httptest.NewServer(idempotency.Middleware(store)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		b, _ := io.ReadAll(r.Body)
		if string(b) == "slow" {
			started <- struct{}{}
			<-release
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		io.WriteString(w, `{"charged":"`+string(b)+`"}`)
	})))
	defer srv.Close()
	post := func(key, body string) (*http.Response, string) {
		req, _ := http.NewRequest("POST", srv.URL+"/charges", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	r1, b1 := post("k1", "500")
	r2, b2 := post("k1", "500")
	if r1.StatusCode != 201 || r2.StatusCode != 201 || b1 != b2 || r2.Header.Get(idempotency.ReplayedHeader) != "true" ||
		r2.Header.Get("Content-Type") != "application/json" || runs.Load() != 1 {
		t.Fatalf("first %d %q, retry %d %q %v, %d runs", r1.StatusCode, b1, r2.StatusCode, b2, r2.Header, runs.Load())
	}
	if r, _ := post("k1", "700"); r.StatusCode != 422 {
		t.Errorf("another body: %d, want 422", r.StatusCode)
	}
	done := make(chan string)
	go func() { _, b := post("k2", "slow"); done <- b }()
	<-started
	if r, _ := post("k2", "slow"); r.StatusCode != 409 || r.Header.Get("Retry-After") != "30" {
		t.Errorf("duplicate in progress: %d Retry-After %q, want 409 and 30", r.StatusCode, r.Header.Get("Retry-After"))
	}
	close(release)
	first := <-done
	if r, b := post("k2", "slow"); r.StatusCode != 201 || b != first || runs.Load() != 2 {
		t.Errorf("after it finished: %d %q, %d runs", r.StatusCode, b, runs.Load())
	}
}

// The database's password never shows in an error or a log line: a server
// that went away, a wrong password.
func TestPasswordNeverShown(t *testing.T) {
	ctx := context.Background()
	srv := pgtest.Start(t) // its own: the test stops it
	pool := connect(t, srv.URL())
	var logs logbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	store := pgstore.New(pool, idempotency.WithMetrics(idempotency.NewMetrics()), idempotency.WithLogger(log), idempotency.WithLease(50*time.Millisecond))
	var errs []error
	wrong, err := pgxpool.New(ctx, strings.Replace(srv.URL(), pgtest.Password, "wrong-"+pgtest.Password, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	_, err = pgstore.New(wrong).Begin(ctx, "s", "k", "r")
	errs = append(errs, err)
	c, err := store.Begin(ctx, "s", "k", "r")
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	_, err = store.Begin(ctx, "s", "k2", "r")
	errs = append(errs, err, store.Complete(ctx, "s", "k", c.Token, idempotency.Response{Status: 200}))
	_, err = store.Once(ctx, "s", "k3", "r", func(context.Context) ([]byte, error) { return nil, nil })
	errs = append(errs, err)
	for i, err := range errs {
		if err == nil {
			t.Fatalf("call %d succeeded against a stopped server or with a wrong password", i)
		}
		if strings.Contains(err.Error(), pgtest.Password) {
			t.Errorf("error %d shows the password: %v", i, err)
		}
	}
	if strings.Contains(logs.String(), pgtest.Password) {
		t.Errorf("the log shows the password:\n%s", logs.String())
	}
	t.Logf("errors: %v", errs)
}

// The DDL docs/idempotency.md shows is the one the store writes (Node's
// pgSchema and Python's schema are compared with the same block).
func TestSchemaDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/idempotency.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(doc), "```sql\n")
	block, _, ok2 := strings.Cut(after, "```")
	if !ok || !ok2 {
		t.Fatal("docs/idempotency.md has no ```sql block")
	}
	if got := pgstore.Schema(pgstore.DefaultTable); got != block {
		t.Errorf("pgstore.Schema:\n%s\ndocs/idempotency.md:\n%s", got, block)
	}
}

// A table made by an older Schema (no claim function): Begin says to run
// the DDL again, and running it (the upgrade) keeps the table's rows.
func TestSchemaAgainUpgradesAnOlderTable(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	table, _, _ := strings.Cut(pgstore.Schema(pgstore.DefaultTable), "CREATE OR REPLACE FUNCTION")
	if _, err := pool.Exec(ctx, table); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO backstop_idempotency (scope, key, state, request, status, headers, body, expires_at)
VALUES ('', 'k1', 'completed', 'r1', 201, '{}', 'paid', now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	store := pgstore.New(pool, idempotency.WithMetrics(idempotency.NewMetrics()))
	if _, err := store.Begin(ctx, "", "k1", "r1"); err == nil || !strings.Contains(err.Error(), "run CreateTable or Schema again") {
		t.Fatalf("Begin on an older table: %v, want the hint to run the DDL again", err)
	}
	if err := store.CreateTable(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := store.Begin(ctx, "", "k1", "r1")
	if err != nil || c.State != idempotency.Completed || c.Response.Status != 201 || string(c.Response.Body) != "paid" {
		t.Fatalf("after the DDL again: %+v %v, want the stored response", c, err)
	}
}

// WithTable: a table of its own, with its own claim function, its name
// quoted as an identifier and as a string (a quote and capitals in it); the
// default table's records are not its.
func TestWithTableKeepsItsOwnRecords(t *testing.T) {
	ctx := context.Background()
	pool := start(t)
	def := pgstore.New(pool, idempotency.WithMetrics(idempotency.NewMetrics()))
	other := def.WithTable(`Idem'Keys`)
	if err := other.CreateTable(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := other.Begin(ctx, "", "k1", "r1")
	if err != nil || c.State != idempotency.Started {
		t.Fatalf("Begin: %+v %v", c, err)
	}
	if err := other.Complete(ctx, "", "k1", c.Token, idempotency.Response{Status: 201, Body: []byte("paid")}); err != nil {
		t.Fatal(err)
	}
	if c, err := other.Begin(ctx, "", "k1", "r1"); err != nil || c.State != idempotency.Completed || string(c.Response.Body) != "paid" {
		t.Fatalf("replay from the other table: %+v %v", c, err)
	}
	if c, err := def.Begin(ctx, "", "k1", "r1"); err != nil || c.State != idempotency.Started {
		t.Fatalf("the default table: %+v %v, want its own first run", c, err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM "Idem'Keys"`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows in the other table: %d %v", n, err)
	}
}
