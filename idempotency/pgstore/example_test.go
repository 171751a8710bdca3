package pgstore_test

import (
	"context"
	"log"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/backstop-dev/backstop/idempotency"
	"github.com/backstop-dev/backstop/idempotency/pgstore"
)

// A worker charges an order and records the charge in one transaction: a
// redelivered job gets the receipt without a second charge, and a
// transaction that rolls back leaves neither.
func ExampleStore_OnceTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db.internal/shop")
	if err != nil {
		log.Fatal(err)
	}
	store := pgstore.New(pool, idempotency.WithLease(30*time.Second))
	jobID, orderID := "job-7", "order-42"

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	receipt, err := store.OnceTx(ctx, tx, "charges", jobID, jobID, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		_, err := tx.Exec(ctx, "INSERT INTO charges (order_id) VALUES ($1)", orderID)
		return []byte("charged " + orderID), err
	})
	if err != nil {
		log.Fatal(err) // *idempotency.InProgressError, idempotency.ErrConflict, or the charge's error
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
	log.Printf("%s", receipt)
}

// The middleware and Once take the PostgreSQL store as they take Redis's.
func ExampleNew() {
	pool, err := pgxpool.New(context.Background(), "postgres://app@db.internal/shop")
	if err != nil {
		log.Fatal(err)
	}
	store := pgstore.New(pool, idempotency.WithRetention(24*time.Hour)).WithTable("shop_idempotency")
	var charges http.Handler = http.NotFoundHandler()
	http.Handle("POST /charges", idempotency.Middleware(store)(charges))
}
