package console_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/prometheus/exporter-toolkit/web"

	"github.com/backstop-dev/backstop/console"
	"github.com/backstop-dev/backstop/internal/plot"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/webconfig"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
)

// The browser tests drive the real pages in Debian's headless chromium
// against real brokers, through exporter-toolkit's basic auth as `backstop
// console` serves them. A missing chromium fails them: they never skip.

// browser starts headless chromium and returns a context for its first tab.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("the browser tests need Debian's chromium (make deps installs it): %v", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.WindowSize(1280, 860), chromedp.Flag("lang", "en-US"))
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// serveAuth serves the console as the command does: exporter-toolkit with a
// web config of one basic-auth user, ops.
func serveAuth(t *testing.T, h http.Handler) string {
	t.Helper()
	cfg := webconfig.BasicAuth(t, "ops", "s3cret")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	addrs, systemd := []string{addr}, false
	go func() {
		done <- web.ListenAndServe(srv, &web.FlagConfig{WebListenAddresses: &addrs, WebSystemdSocket: &systemd, WebConfigFile: &cfg},
			slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	})
	eventually.True(t, 10*time.Second, "the console listening", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return "http://" + addr
}

// signIn sends ops's credentials with every request of the tab.
func signIn(user, pass string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{
			"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))}})
		return err
	})
}

func run(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// get runs an action that returns a value.
func get[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// inert checks that nothing a payload or an error holds ran or became an
// element: the page has no script, no injected image, and its title is the
// console's.
func inert(t *testing.T, ctx context.Context, where string) {
	t.Helper()
	scripts := get(t, ctx, where+": scripts", chromedp.Evaluate[int](`document.scripts.length`))
	imgs := get(t, ctx, where+": images", chromedp.Evaluate[int](`document.querySelectorAll('img[src="x"]').length`))
	title := get(t, ctx, where+": title", chromedp.Title())
	if scripts != 0 || imgs != 0 || strings.Contains(title, "pwned") || !strings.Contains(title, "backstop console") {
		t.Errorf("%s: %d scripts, %d injected images, title %q: a hostile string came alive", where, scripts, imgs, title)
	}
}

// postForm submits a form the test builds in the page (the console's CSP
// lets no script fetch), and returns the text of the page it leads to.
func postForm(t *testing.T, ctx context.Context, path string, fields map[string]string) string {
	t.Helper()
	js := fmt.Sprintf(`(() => { const f = document.createElement("form"); f.method = "post"; f.action = %q;
		for (const [k, v] of Object.entries(%s)) { const i = document.createElement("input"); i.name = k; i.value = v; f.append(i); }
		document.body.append(f); f.submit(); return true; })()`, path, mustJSON(t, fields))
	get(t, ctx, "post "+path, chromedp.Evaluate[bool](js))
	var body string
	eventually.True(t, 10*time.Second, "the answer to POST "+path, func() bool {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		u, err := chromedp.Run(c, chromedp.Evaluate[string](`location.pathname + "|" + document.readyState`))
		if err != nil || u != path+"|complete" {
			return false // still on the page before, or loading
		}
		body, err = chromedp.Run(c, chromedp.Text(chromedp.CSS("body")))
		return err == nil
	})
	return body
}

func mustJSON(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func rows(t *testing.T, ctx context.Context) int {
	t.Helper()
	return get(t, ctx, "count rows", chromedp.Evaluate[int](`document.querySelectorAll("tr.letter").length`))
}

func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	return get(t, ctx, "read "+sel, chromedp.Text(chromedp.CSS(sel)))
}

// shoot writes a screenshot of the tab to docs/img when
// BACKSTOP_SCREENSHOTS=1 (so that CI does not rewrite them).
func shoot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if os.Getenv("BACKSTOP_SCREENSHOTS") != "1" {
		return
	}
	png := get(t, ctx, "screenshot "+name, chromedp.FullScreenshot(100))
	if err := os.WriteFile(filepath.Join("..", "docs", "img", name), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

var quiet = console.WithLogger(slog.New(slog.DiscardHandler))

func TestBrowser(t *testing.T) {
	for _, br := range brokers {
		t.Run(br.name, func(t *testing.T) {
			b := br.open(t)
			q := seeded(t, b, "payments")
			// A delayed job to force-run: it fails with a retry an hour away.
			ctx0 := context.Background()
			if _, err := q.Enqueue(ctx0, "later-1", []byte(`{"report":"daily"}`), queue.EnqueueOptions{Type: "report"}); err != nil {
				t.Fatal(err)
			}
			stop := work(t, q, `{"max_attempts": 5, "backoff": {"strategy": "constant", "base": "1h", "cap": "1h"}, "jitter": {"mode": "none"}}`,
				func(context.Context, queue.Job) error { return errors.New("upstream answered 503") })
			eventually.True(t, 30*time.Second, "later-1 delayed", func() bool {
				st, err := q.Stats(ctx0)
				return err == nil && st.Jobs == 0 && (st.Delayed == nil || *st.Delayed == 1)
			})
			stop()
			h, err := console.New(b.Kind(), []queue.Queue{q}, console.WithWritable(true), console.WithPageSize(20), quiet,
				withPreset(t, "default"))
			if err != nil {
				t.Fatal(err)
			}
			base := serveAuth(t, h)
			ctx := browser(t)
			list := base + "/queues/" + q.Name() + "/dlq"

			// Without credentials: the page is refused (chromium ends the
			// navigation on the 401), and so is a write.
			nav := func() error {
				c, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				return chromedp.Do(c, chromedp.Navigate(base+"/"))
			}
			if err := nav(); err == nil || !strings.Contains(err.Error(), "ERR_INVALID_AUTH_CREDENTIALS") {
				var body string
				if err == nil {
					body = text(t, ctx, "body")
				}
				if !strings.Contains(body, "Unauthorized") {
					t.Errorf("overview without credentials: %v, %q; want it refused", err, body)
				}
			}
			resp, err := http.PostForm(base+"/queues/"+q.Name()+"/discard", url.Values{"action": {"purge"}, "note": {"x"}})
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("a write without credentials: %d, want 401", resp.StatusCode)
			}

			// The overview and the list.
			run(t, ctx, "overview", signIn("ops", "s3cret"), chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("#queues")))
			if got := text(t, ctx, "td.dlq"); got != "5" {
				t.Errorf("overview: DLQ %q, want 5", got)
			}
			// The overview's screenshot is TestOverviewHistoryWithoutPrometheus's:
			// its last hour has figures.
			run(t, ctx, "list", chromedp.Click(chromedp.CSS(`nav a`)), chromedp.WaitVisible(chromedp.CSS("#letters")))
			if n := rows(t, ctx); n != 5 {
				t.Errorf("list: %d rows, want 5", n)
			}
			inert(t, ctx, "list")

			// Filter by type.
			run(t, ctx, "filter", chromedp.SetValue(chromedp.CSS(`#filter input[name="type"]`), "sms"),
				chromedp.Submit(chromedp.CSS(`#filter`)), chromedp.WaitVisible(chromedp.CSS("#letters")))
			eventually.True(t, 10*time.Second, "the filtered list", func() bool { return rows(t, ctx) == 2 })

			// Open the hostile entry: its payload is the textarea's text.
			run(t, ctx, "open j-0", chromedp.Navigate(list+"?id=j-0"), chromedp.Click(chromedp.CSS(`a.open`)),
				chromedp.WaitVisible(chromedp.CSS("#entry")))
			payload := get(t, ctx, "payload", chromedp.Value(chromedp.CSS("#payload")))
			if payload != hostilePayload {
				t.Errorf("entry j-0: the textarea holds %q, want the payload as text", payload)
			}
			if got := text(t, ctx, "#last-error"); got != hostileError {
				t.Errorf("entry j-0: last error %q, want %q", got, hostileError)
			}
			inert(t, ctx, "entry")
			if b.Kind() == "redis" {
				run(t, ctx, "open j-2", chromedp.Navigate(list+"?id=j-2"), chromedp.Click(chromedp.CSS(`a.open`)),
					chromedp.WaitVisible(chromedp.CSS("#entry")))
				shoot(t, ctx, "console-dead-letter.png")
			}

			// A write without the CSRF token is refused, from the page itself.
			if got := postForm(t, ctx, "/queues/"+q.Name()+"/discard", map[string]string{"action": "delete", "id": "j-3", "note": "x"}); !strings.Contains(got, "CSRF") {
				t.Errorf("delete without a CSRF token: %q, want it refused", got)
			}

			// Delete j-2 with a note.
			run(t, ctx, "delete j-2", chromedp.Navigate(list+"/entry?id=j-2"), chromedp.WaitVisible(chromedp.CSS("#delete")),
				chromedp.SetValue(chromedp.CSS(`#delete input[name="note"]`), "refunded by hand, ticket 7"),
				chromedp.Submit(chromedp.CSS(`#delete`)), chromedp.WaitVisible(chromedp.CSS("#result")))
			if got := text(t, ctx, "#result"); !strings.Contains(got, "1 dead letters discarded") {
				t.Errorf("delete: %q", got)
			}
			// The audit line, with the signed-in user.
			run(t, ctx, "audit", chromedp.Navigate(base+"/queues/"+q.Name()+"/audit"), chromedp.WaitVisible(chromedp.CSS("#audit")))
			if got := text(t, ctx, "tr.record"); !strings.Contains(got, "console:ops") || !strings.Contains(got, "refunded by hand, ticket 7") || !strings.Contains(got, "j-2") {
				t.Errorf("audit line %q, want j-2's delete by console:ops with the note", got)
			}

			// Replay the sms ones at 2/s, watching the progress.
			run(t, ctx, "replay sms", chromedp.Navigate(list+"?type=sms"), chromedp.WaitVisible(chromedp.CSS("#replay")),
				chromedp.SetValue(chromedp.CSS(`#replay input[name="rate"]`), "2/s"),
				chromedp.Submit(chromedp.CSS(`#replay`)), chromedp.WaitVisible(chromedp.CSS("#progress")))
			eventually.True(t, 30*time.Second, "the replay done", func() bool {
				// The page reloads itself every second: a read may meet a
				// reload, and is tried again.
				c, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				line, err := chromedp.Run(c, chromedp.Text(chromedp.CSS("#progress-line")))
				return err == nil && strings.HasPrefix(line, "Done")
			})
			if got := text(t, ctx, "#moved"); got != "2" {
				t.Errorf("replay: %s moved, want 2", got)
			}
			dlqSize(t, q, 2) // the replay's acks applied
			run(t, ctx, "list after", chromedp.Navigate(list), chromedp.WaitVisible(chromedp.CSS("#letters")))
			if n := rows(t, ctx); n != 2 {
				t.Errorf("after the delete and the replay: %d rows, want 2", n)
			}

			// Force-run the delayed job.
			run(t, ctx, "force run", chromedp.SetValue(chromedp.CSS(`#run input[name="id"]`), "later-1"),
				chromedp.Submit(chromedp.CSS(`#run`)), chromedp.WaitVisible(chromedp.CSS("main h1")))
			body := text(t, ctx, "main")
			// On RabbitMQ too (issue 45): the worker stopped once later-1's
			// retry was applied, so it waits in its delay level.
			want := "job later-1 runs now"
			if !runSupported[b.Kind()] {
				want = "not supported" // issue 45: a delayed job cannot be picked out yet
			}
			if !strings.Contains(body, want) {
				t.Errorf("force run: %q, want %q", body, want)
			}
			if runSupported[b.Kind()] {
				// The run's audit line, newest first, with the signed-in user.
				run(t, ctx, "audit after the run", chromedp.Navigate(base+"/queues/"+q.Name()+"/audit"), chromedp.WaitVisible(chromedp.CSS("#audit")))
				if got := text(t, ctx, "tr.record"); !strings.Contains(got, "run") || !strings.Contains(got, "console:ops") || !strings.Contains(got, "later-1") {
					t.Errorf("audit line %q, want later-1's run by console:ops", got)
				}
			}

			// Read-only: the same pages offer no write.
			ro, err := console.New(b.Kind(), []queue.Queue{q}, quiet)
			if err != nil {
				t.Fatal(err)
			}
			roBase := serveAuth(t, ro)
			for _, p := range []string{"/queues/" + q.Name() + "/dlq", "/queues/" + q.Name() + "/dlq/entry?id=j-0"} {
				run(t, ctx, "read-only "+p, chromedp.Navigate(roBase+p), chromedp.WaitVisible(chromedp.CSS("main")))
				forms := get(t, ctx, "forms", chromedp.Evaluate[int](`document.querySelectorAll('form[method="post"]').length`))
				buttons := get(t, ctx, "buttons", chromedp.Evaluate[int](`[...document.querySelectorAll("button")].filter(b => /replay|delete|purge|run/i.test(b.textContent)).length`))
				if forms != 0 || buttons != 0 {
					t.Errorf("read-only %s: %d write forms, %d write buttons", p, forms, buttons)
				}
			}
			if got := postForm(t, ctx, "/queues/"+q.Name()+"/discard", map[string]string{"action": "delete", "id": "j-0", "note": "x"}); !strings.Contains(got, "404") && !strings.Contains(got, "Method Not Allowed") {
				t.Errorf("read-only POST: %q, want 404 or 405", got)
			}
			if n := dlqSize(t, q, 2); n != 2 {
				t.Errorf("after the read-only console: %d dead letters, want 2", n)
			}
		})
	}
}

// withPreset shows preset name as the policy in force, with its schedule.
func withPreset(t *testing.T, name string) console.Option {
	t.Helper()
	text, ok := policy.PresetText(name)
	if !ok {
		t.Fatalf("no preset %q", name)
	}
	p, err := policy.Parse([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	var svg bytes.Buffer
	if err := plot.Schedule(&svg, "svg", plot.NewEnvelope(p, name, 12, 200, 1)); err != nil {
		t.Fatal(err)
	}
	return console.WithPolicy(name, text, svg.Bytes())
}
