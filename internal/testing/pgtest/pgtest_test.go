package pgtest_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/backstop-dev/backstop/internal/testing/pgtest"
)

func TestStart(t *testing.T) {
	s := pgtest.Start(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var port string
	if err := conn.QueryRow(ctx, "SHOW port").Scan(&port); err != nil || s.Addr != "127.0.0.1:"+port {
		t.Fatalf("port %s %v, want the private server's %s", port, err, s.Addr)
	}
	// A wrong password is refused: the server checks passwords over TCP.
	bad, err := pgx.Connect(ctx, "postgres://"+pgtest.Superuser+":wrong@"+s.Addr+"/postgres?sslmode=disable")
	if err == nil {
		bad.Close(ctx)
		t.Fatal("a wrong password was accepted")
	}
}
