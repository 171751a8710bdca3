package idempotency_test

import (
	"testing"

	"github.com/backstop-dev/backstop/idempotency"
	"github.com/backstop-dev/backstop/internal/testing/idemcases"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
)

// A job redelivered (the worker crashed after the side effect, before its
// ack) returns its recorded result; a failure releases the key.
// idempotency/pgstore runs the same checks on PostgreSQL.
func TestOnceRunsAJobOnce(t *testing.T) {
	rdb := redistest.Start(t).Client()
	idemcases.Once(t, idempotency.New(rdb, idempotency.WithMetrics(idempotency.NewMetrics())))
}
