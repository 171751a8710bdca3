package retry_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/retry"
)

const attemptTimeout = "max_attempts: 3\nattempt_timeout: 50ms\nbackoff: {strategy: constant, base: 1ms}\njitter: {mode: none}\n"

// hang is an operation that returns only when its context ends, and
// records each attempt's deadline.
func hang(deadlines *[]time.Time) retry.Operation[string] {
	return func(ctx context.Context) (string, error) {
		dl, _ := ctx.Deadline()
		*deadlines = append(*deadlines, dl)
		<-ctx.Done()
		return "", ctx.Err()
	}
}

func TestAttemptTimeout(t *testing.T) {
	rt, err := host.New(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(context.Background()) })
	hp, err := rt.Load(context.Background(), []byte(attemptTimeout))
	if err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]backstop.Decider{"native": parse(t, attemptTimeout), "wasm": hp} {
		t.Run(name, func(t *testing.T) {
			var deadlines []time.Time
			_, err := retry.Do(context.Background(), p, hang(&deadlines), retry.WithClock(&retry.FakeClock{T: t0}))
			var re *retry.Error
			if !errors.As(err, &re) || re.Reason != policy.MaxAttemptsReached || re.Attempts != 3 {
				t.Fatalf("Do = %v, want max_attempts_reached after 3 attempts", err)
			}
			if len(deadlines) != 3 {
				t.Fatalf("%d attempts, want 3", len(deadlines))
			}
			for i, dl := range deadlines {
				if dl.IsZero() {
					t.Errorf("attempt %d had no deadline", i+1)
				}
			}
			var f *backstop.Failure
			if !errors.As(err, &f) || f.ErrorKind != "timeout" || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("last error %v: want a timeout failure wrapping context.DeadlineExceeded", err)
			}
		})
	}
}

// The overall deadline bounds the attempt running into it: max_elapsed
// 200ms leaves the first attempt 200ms whatever attempt_timeout says, and
// with a fake clock standing still each later attempt gets the same.
func TestAttemptTimeoutCutToMaxElapsed(t *testing.T) {
	p := parse(t, "max_attempts: 2\nmax_elapsed: 200ms\nattempt_timeout: 1h\nbackoff: {strategy: constant, base: 1ms}\njitter: {mode: none}\n")
	var deadlines []time.Time
	before := time.Now()
	_, err := retry.Do(context.Background(), p, hang(&deadlines), retry.WithClock(&retry.FakeClock{T: t0}))
	after := time.Now()
	if len(deadlines) != 2 || err == nil {
		t.Fatalf("%d attempts, err %v; want 2 timed-out attempts", len(deadlines), err)
	}
	if dl := deadlines[0]; dl.Before(before.Add(200*time.Millisecond)) || dl.After(after) {
		t.Errorf("first attempt's deadline %v after the start; want 200ms (max_elapsed), not attempt_timeout's hour", dl.Sub(before))
	}
}

// A response's body is read after Do returns: the attempt's time covers
// it, and closing it releases the attempt; Do must not cancel it first.
func TestAttemptTimeoutLeavesTheBodyReadable(t *testing.T) {
	sent := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.(http.Flusher).Flush()
		<-sent // the body follows once Do has returned
		io.WriteString(w, "the body")
	}))
	t.Cleanup(srv.Close)
	p := parse(t, "max_attempts: 2\nattempt_timeout: 1m\n")
	resp, err := retry.Do(context.Background(), p, func(ctx context.Context) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		return http.DefaultClient.Do(req)
	})
	close(sent)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(b) != "the body" {
		t.Fatalf("body %q, %v; want it whole after Do returned", b, err)
	}
}

// An operation that answers within its time is not touched.
func TestAttemptTimeoutNotReached(t *testing.T) {
	n := 0
	v, err := retry.Do(context.Background(), parse(t, attemptTimeout), calls(&n, errors.New("boom")), retry.WithClock(&retry.FakeClock{T: t0}))
	if err != nil || v != "done" || n != 2 {
		t.Fatalf("Do = %q, %v after %d calls; want done after 2", v, err, n)
	}
}
