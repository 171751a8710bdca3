package pgstore_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/backstop-dev/backstop/idempotency/pgstore"
	"github.com/backstop-dev/backstop/internal/testing/casetest"
	"github.com/backstop-dev/backstop/internal/testing/idemcases"
	"github.com/backstop-dev/backstop/internal/testing/pgtest"
)

// pgRaw is the record as a row: the cases' fields are its columns, shown
// as the Redis hash holds them (status and too_large as text, body base64,
// headers "" when too large, truncated only when set).
type pgRaw struct {
	pool       *pgxpool.Pool
	scope, key string
	retention  int64
}

func (r pgRaw) exec(ctx context.Context, sql string, args ...any) error {
	_, err := r.pool.Exec(ctx, sql, append([]any{r.scope, r.key}, args...)...)
	return err
}

func (r pgRaw) Reset(ctx context.Context) error {
	return r.exec(ctx, `DELETE FROM backstop_idempotency WHERE scope = $1 AND key = $2`)
}

func (r pgRaw) Lapse(ctx context.Context) error {
	return r.exec(ctx, `UPDATE backstop_idempotency SET lease_until = clock_timestamp() - interval '1 second' WHERE scope = $1 AND key = $2`)
}

// Expire moves the end of the retention into the past (the row stays: the
// store must treat it as absent, as Redis has dropped the key).
func (r pgRaw) Expire(ctx context.Context) error {
	return r.exec(ctx, `UPDATE backstop_idempotency SET expires_at = clock_timestamp() - interval '1 millisecond' WHERE scope = $1 AND key = $2`)
}

func (r pgRaw) Write(ctx context.Context, f map[string]string) error {
	var status *int
	if v, ok := f["status"]; ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			return err
		}
		status = &n
	}
	var headers *string
	if v, ok := f["headers"]; ok && v != "" {
		headers = &v
	}
	body, err := base64.StdEncoding.DecodeString(f["body"])
	if err != nil {
		return err
	}
	var token *string
	if v, ok := f["token"]; ok {
		token = &v
	}
	return r.exec(ctx, `INSERT INTO backstop_idempotency (scope, key, state, token, request, status, headers, body, too_large,
  truncated, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, clock_timestamp() + $11 * interval '1 millisecond')`,
		f["state"], token, f["request"], status, headers, body, f["too_large"] == "1", f["truncated"] == "1", r.retention)
}

func (r pgRaw) Record(ctx context.Context, tokens map[string]string) (map[string]any, error) {
	var (
		state, request   string
		token, headers   *string
		status           *int
		body             []byte
		large, truncated bool
		leaseMS, ttlMS   *float64
	)
	err := r.pool.QueryRow(ctx, `SELECT state, token, request, status, headers::text, body, too_large, truncated,
  extract(epoch FROM lease_until - clock_timestamp()) * 1000, extract(epoch FROM expires_at - clock_timestamp()) * 1000
FROM backstop_idempotency WHERE scope = $1 AND key = $2 AND expires_at > clock_timestamp()`, r.scope, r.key).
		Scan(&state, &token, &request, &status, &headers, &body, &large, &truncated, &leaseMS, &ttlMS)
	if err != nil {
		if err.Error() == "no rows in result set" {
			return nil, nil
		}
		return nil, err
	}
	out := map[string]any{"state": state, "request": request, "ttl_s": int64(math.Round(*ttlMS / 1000))}
	if token != nil {
		out["token"] = *token
		for caller, tok := range tokens {
			if *token == tok {
				out["token"] = "{" + caller + "}"
			}
		}
	}
	if leaseMS != nil {
		out["lease_until"] = fmt.Sprintf("{now%+ds}", int64(math.Round(*leaseMS/1000)))
	}
	if state == "completed" {
		out["status"] = strconv.Itoa(*status)
		out["body"] = base64.StdEncoding.EncodeToString(body)
		out["too_large"] = map[bool]string{false: "0", true: "1"}[large]
		out["headers"] = ""
		if headers != nil {
			var parsed any
			if err := json.Unmarshal([]byte(*headers), &parsed); err != nil {
				return nil, err
			}
			out["headers"] = parsed
		}
		if truncated {
			out["truncated"] = "1"
		}
	}
	return out, nil
}

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// start returns a pool on a fresh database of the package's private
// PostgreSQL server, with the store's table created.
func start(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return connect(t, pgtest.Database(t))
}

func connect(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pgstore.New(pool).CreateTable(context.Background()); err != nil {
		t.Fatal(err)
	}
	return pool
}

// Every shared case, as the Redis store answers it, against a real
// PostgreSQL server.
func TestIdempotencyCases(t *testing.T) {
	ctx := context.Background()
	pool := start(t)
	var file idemcases.File
	casetest.Read(t, idemcases.RootPath, &file)
	store := pgstore.New(pool, file.Options()...)
	idemcases.Compare(t, ctx, store, pgRaw{pool: pool, scope: file.Scope, key: file.Key, retention: file.RetentionMS}, &file)
}
