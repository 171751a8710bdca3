package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// quietRedis drops go-redis's own log lines (a line per failed dial, over
// seconds of retries): a command reports its one error itself.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// reachTimeout bounds the first contact with Redis.
const reachTimeout = 5 * time.Second

// reach dials Redis once, before a command uses it, and turns a failure
// into one line: the address, the cause and what to try (the client would
// retry each command for seconds first). For a cluster, one reachable
// address is enough: the client finds the others. flagName is the flag
// that gave the addresses.
func reach(ctx context.Context, addrs []string, flagName string) error {
	ctx, cancel := context.WithTimeout(ctx, reachTimeout)
	defer cancel()
	var d net.Dialer
	var err error
	for _, a := range addrs {
		var c net.Conn
		if c, err = d.DialContext(ctx, "tcp", a); err == nil {
			c.Close()
			return nil
		}
	}
	cause := err.Error()
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		cause = op.Err.Error()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		cause = fmt.Sprintf("no answer within %s", reachTimeout)
	}
	return fmt.Errorf("cannot reach Redis at %s: %s (is redis-server running there? give its address with %s)",
		strings.Join(addrs, ","), cause, flagName)
}

// reachHook runs reach before the client's first command, so that the
// command's own checks of its flags come first, and an unreachable Redis
// fails that command at once with reach's one line.
type reachHook struct {
	addrs    []string
	flagName string
	once     sync.Once
	err      error
}

func (h *reachHook) check(ctx context.Context) error {
	h.once.Do(func() { h.err = reach(ctx, h.addrs, h.flagName) })
	return h.err
}

func (h *reachHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *reachHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := h.check(ctx); err != nil {
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (h *reachHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if err := h.check(ctx); err != nil {
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		return next(ctx, cmds)
	}
}
