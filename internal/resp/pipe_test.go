package resp

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
)

// TestTransports runs one pipe over a connection of its own and over the
// client's pipelines, in RESP2 and RESP3: the replies read alike.
func TestTransports(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	admin := srv.Client()
	if err := admin.HSet(ctx, "h", "a", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.XAdd(ctx, &redis.XAddArgs{Stream: "s", ID: "5-0", Values: []any{"f", "v"}}).Err(); err != nil {
		t.Fatal(err)
	}
	for _, protocol := range []int{2, 3} {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Protocol: protocol})
		t.Cleanup(func() { rdb.Close() })
		for name, tr := range map[string]Transport{"own": NewTransport(rdb), "client": NewClientTransport(rdb)} {
			if _, own := tr.(*ConnTransport); own != (name == "own") {
				t.Fatalf("%s: transport %T", name, tr)
			}
			p := NewPipe(tr, nil)
			xlen, hash, missing, wrong := p.Do("XLEN", "s"), p.Do("HGETALL", "h"), p.Do("GET", "nokey"), p.Do("XLEN", "h")
			xrange := p.Do("XRANGE", "s", "-", "+")
			if p.Exec(ctx) {
				t.Fatalf("%s: abandoned", name)
			}
			if n, ok := p.Reply(xlen).Int(); !ok || n != 1 {
				t.Errorf("%s RESP%d: XLEN %v", name, protocol, p.Reply(xlen))
			}
			if a, ok := p.Reply(hash).Field("a").Str(); !ok || a != "1" {
				t.Errorf("%s RESP%d: HGETALL %v", name, protocol, p.Reply(hash))
			}
			if v := p.Reply(missing); !v.IsNil() || v.Err() != nil {
				t.Errorf("%s RESP%d: GET of no key %v (%v)", name, protocol, v, v.Err())
			}
			var rerr redis.Error
			if err := p.Reply(wrong).Err(); !errors.As(err, &rerr) {
				t.Errorf("%s RESP%d: XLEN of a hash: %v, want an error reply", name, protocol, err)
			}
			if id := p.Reply(xrange).First().First().Bytes(); string(id) != "5-0" {
				t.Errorf("%s RESP%d: XRANGE %v", name, protocol, p.Reply(xrange))
			}
			if err := p.Reply(NoRef).Err(); !errors.Is(err, ErrNoReply) {
				t.Errorf("%s: reply of NoRef: %v", name, err)
			}

			if name == "own" {
				// A budget already spent: nothing is sent, every command
				// says why. (Over the client the budget may leave the
				// pipeline behind, abandoned, or go-redis may run it.)
				spent, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
				p := NewPipe(tr, nil)
				c := p.Do("PING")
				if p.Exec(spent) {
					t.Errorf("%s: abandoned", name)
				}
				cancel()
				if err := p.Reply(c).Err(); !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("%s: out of time: %v", name, err)
				}
			}
			if err := tr.Close(); err != nil {
				t.Error(err)
			}
		}
	}
}

// TestZeroReply: the zero Reply is a nil reply, whatever is asked of it.
func TestZeroReply(t *testing.T) {
	var v Reply
	if !v.IsNil() || v.Err() != nil || v.Len() != -1 || v.Bytes() != nil || !v.Next().IsNil() || !v.First().IsNil() || !v.Field("x").IsNil() || v.String() != "<nil>" {
		t.Errorf("zero reply: %v", v)
	}
	if _, ok := v.Int(); ok {
		t.Error("zero reply is an integer")
	}
}
