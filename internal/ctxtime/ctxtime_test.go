package ctxtime

import (
	"context"
	"testing"
	"time"
)

func TestSleep(t *testing.T) {
	if !Sleep(context.Background(), 0) {
		t.Error("Sleep(live ctx, 0) = false, want true")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// An hour: only the cancelled context can end it.
	if Sleep(ctx, time.Hour) {
		t.Error("Sleep(cancelled ctx, 1h) = true, want false")
	}
}
