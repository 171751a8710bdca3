package docs_test

// The Go block of docs/idempotency.md, "Go", run as written
// (TestDocsEveryBlockIsRun checks that it appears here).

import (
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/backstop-dev/backstop/idempotency"
	"github.com/backstop-dev/backstop/idempotency/pgstore"
	"github.com/backstop-dev/backstop/internal/testing/pgtest"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
)

func TestIdempotencyDocGo(t *testing.T) {
	rdb := redistest.Start(t).Client()
	charges := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) })

	store := idempotency.New(rdb, idempotency.WithLease(30*time.Second), idempotency.WithRetention(24*time.Hour))
	mux := http.NewServeMux()
	mux.Handle("POST /charges", idempotency.Middleware(store)(charges))

	srv := httptest.NewServer(mux)
	defer srv.Close()
	var got []string
	for range 2 {
		req, _ := http.NewRequest("POST", srv.URL+"/charges", strings.NewReader(`{"amount": 10}`))
		req.Header.Set("Idempotency-Key", "order-42")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		got = append(got, resp.Status+" replayed="+resp.Header.Get(idempotency.ReplayedHeader))
	}
	if want := "201 Created replayed=,201 Created replayed=true"; strings.Join(got, ",") != want {
		t.Fatalf("got %v, want %s", got, want)
	}
}

type chargeJob struct {
	ID, OrderID string
	Cents       int
}

// The Go block of docs/idempotency.md, "PostgreSQL", run as written.
func chargeInTx(ctx context.Context, pool *pgxpool.Pool, job chargeJob) error {
	store := pgstore.New(pool, idempotency.WithLease(30*time.Second))
	if err := store.CreateTable(ctx); err != nil {
		return err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	receipt, err := store.OnceTx(ctx, tx, "charges", job.ID, job.ID, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		_, err := tx.Exec(ctx, "INSERT INTO charges (order_id, cents) VALUES ($1, $2)", job.OrderID, job.Cents)
		return []byte("charged " + job.OrderID), err
	})
	if err != nil {
		return err
	}
	log.Printf("job %s: %s", job.ID, receipt)
	return tx.Commit(ctx)
}

func TestIdempotencyDocPostgres(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.Start(t).URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE charges (order_id text PRIMARY KEY, cents int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	job := chargeJob{ID: "job-7", OrderID: "order-42", Cents: 500}
	for i := range 2 { // the second delivery replays: a second INSERT would break the primary key
		if err := chargeInTx(ctx, pool, job); err != nil {
			t.Fatalf("delivery %d: %v", i+1, err)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM charges`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d charges (%v), want 1", n, err)
	}
}
