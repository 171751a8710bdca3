// Package eventually is the one place where Go tests wait: for a condition
// they can observe, polled until a deadline. The deadline catches a hang; it
// is never the thing a test asserts, so it is generous.
//
//	eventually.True(t, 10*time.Second, "queue e discovered", func() bool {
//		return gather(t, c)["backstop_queues"] == 5
//	})
package eventually

import (
	"errors"
	"testing"
	"time"
)

// Poll is the pause between two checks of a condition.
const Poll = 10 * time.Millisecond

// True polls cond until it returns true, and fails the test (naming what
// it waited for) if deadline passes first. cond runs on the test's
// goroutine.
func True(t testing.TB, deadline time.Duration, what string, cond func() bool) {
	t.Helper()
	if err := Wait(deadline, cond); err != nil {
		t.Fatalf("timed out after %v waiting for %s", deadline, what)
	}
}

// ErrTimeout is what Wait returns when the deadline passes first.
var ErrTimeout = errors.New("eventually: the deadline passed before the condition held")

// Wait polls cond until it returns true, or returns ErrTimeout once
// deadline has passed. It serves code that cannot take a testing.TB (a
// helper process started by a test).
func Wait(deadline time.Duration, cond func() bool) error {
	end := time.Now().Add(deadline)
	for !cond() {
		if !time.Now().Before(end) {
			return ErrTimeout
		}
		time.Sleep(Poll)
	}
	return nil
}
