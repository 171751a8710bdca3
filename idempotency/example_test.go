package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/idempotency"
)

// A retried POST with the same Idempotency-Key gets the first response
// instead of charging twice. (Needs a Redis server: not run as a test.)
func ExampleMiddleware() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	store := idempotency.New(rdb, idempotency.WithRetention(24*time.Hour))
	charges := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintln(w, `{"charge": "ch_1"}`)
	})
	http.Handle("/charges", idempotency.Middleware(store)(charges))
}

// A queue job's side effect runs once per job id, even when the job is
// redelivered after a crash: the redelivery gets the recorded result.
// (Needs a Redis server: not run as a test.)
func ExampleStore_Once() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	store := idempotency.New(rdb)
	jobID := "order-42"
	res, err := store.Once(context.Background(), "charges", jobID, jobID, func(ctx context.Context) ([]byte, error) {
		return json.Marshal(map[string]string{"charge": "ch_1"}) // charge the card here
	})
	fmt.Println(string(res), err)
}

// Keys are 1 to 255 printable ASCII characters.
func ExampleCheckKey() {
	for _, key := range []string{"3f9c1e7a-order-42", "", "naïve"} {
		fmt.Println(idempotency.CheckKey(key))
	}
	// Output:
	// <nil>
	// idempotency: key must not be empty
	// idempotency: key must be printable ASCII, byte 2 is 0xc3
}

// The fingerprint tells a retry (same request) from a key reused for
// another request (422).
func ExampleFingerprint() {
	a := idempotency.Fingerprint("POST", "/charges", []byte(`{"amount": 100}`))
	b := idempotency.Fingerprint("POST", "/charges", []byte(`{"amount": 200}`))
	fmt.Println(len(a), a == b, a == idempotency.Fingerprint("POST", "/charges", []byte(`{"amount": 100}`)))
	// Output:
	// 64 false true
}

// A record lives under one hash tag per scope and key (Redis Cluster).
func ExampleStore_RecordKey() {
	store := idempotency.New(nil, idempotency.WithPrefix("idem"))
	fmt.Println(store.RecordKey("charges", "order-42"))
	// Output:
	// idem:{charges:order-42}
}
