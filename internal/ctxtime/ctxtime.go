// Package ctxtime holds the waits that a context cuts short, for the loops
// of the workers and the demo, and the exporter's scrape budget.
package ctxtime

import (
	"context"
	"time"
)

// Sleep waits d or until ctx is done; it reports whether ctx is still live.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Within runs f in its own goroutine and waits for it until ctx ends, so
// a budget holds even over a client that ignores context deadlines. It
// reports whether f returned; when it did not, f goes on alone and the
// caller must not read what f writes.
func Within(ctx context.Context, f func()) bool {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}
