// Package ctxtime holds the waits that a context cuts short, for the loops
// of the workers and the demo.
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
