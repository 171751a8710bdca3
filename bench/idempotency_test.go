package bench

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/idempotency"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
)

// BenchmarkIdempotencyMiddleware: the latency one request gains from an
// idempotency guard, against a real redis-server on loopback, with the
// handler and the HTTP server out of the picture (ServeHTTP on a recorder).
//
//   - none: the bare handler.
//   - setnx: what people write by hand: SET key PROCESSING NX EX 86400, run,
//     SET key <status> XX; a retry GETs the key. No lease (a crash blocks the
//     key for the day), no request hash, no stored headers.
//   - backstop: idempotency.Middleware: one script run to begin, one to
//     complete; a replay is the begin alone.
//
// first = a new key each request (the handler runs); replay = the same key.
func BenchmarkIdempotencyMiddleware(b *testing.B) {
	rdb := redistest.Start(b).Client()
	ctx := context.Background()
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		w.Write([]byte(`{"id":"ch_1","amount":10}`))
	})
	store := idempotency.New(rdb, idempotency.WithMetrics(idempotency.NewMetrics()))
	impls := map[string]http.Handler{
		"none":     handler,
		"setnx":    setNX(rdb, handler),
		"backstop": idempotency.Middleware(store)(handler),
	}
	for _, name := range []string{"none", "setnx", "backstop"} {
		for _, mode := range []string{"first", "replay"} {
			b.Run(name+"/"+mode, func(b *testing.B) {
				rdb.FlushAll(ctx)
				h := impls[name]
				body := []byte(`{"amount":10}`)
				for i := 0; b.Loop(); i++ {
					key := "k"
					if mode == "first" {
						key = "k" + strconv.Itoa(i)
					}
					req := httptest.NewRequest("POST", "/charges", bytes.NewReader(body))
					req.Header.Set("Idempotency-Key", key)
					w := httptest.NewRecorder()
					h.ServeHTTP(w, req)
					if w.Code != 201 {
						b.Fatalf("%s: status %d %s", name, w.Code, w.Body)
					}
				}
			})
		}
	}
}

func setNX(rdb *redis.Client, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := "idem:" + r.Header.Get("Idempotency-Key")
		ok, err := rdb.SetNX(r.Context(), key, "PROCESSING", 24*time.Hour).Result()
		if err != nil {
			http.Error(w, err.Error(), 503)
			return
		}
		if !ok {
			v, _ := rdb.Get(r.Context(), key).Result()
			if v == "PROCESSING" {
				http.Error(w, "in progress", 409)
				return
			}
			status, body, _ := strings.Cut(v, " ")
			code, _ := strconv.Atoi(status)
			w.WriteHeader(code)
			w.Write([]byte(body))
			return
		}
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		rdb.SetXX(r.Context(), key, strconv.Itoa(rec.Code)+" "+rec.Body.String(), 24*time.Hour)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes())
	})
}
