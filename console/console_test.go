package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/backstop-dev/backstop/console"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/queue"
)

// The seeded DLQ of every test: five jobs of two types, a hostile text
// payload, a binary one.
func seeded(t *testing.T, b queue.Broker, name string) queue.Queue {
	t.Helper()
	if b.Kind() != "redis" { // a broker of its own per test on Redis; RabbitMQ's is shared
		name += "-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 10)
	}
	q, err := b.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	seedLetters(t, q, []letter{
		{"j-0", "email", []byte(hostilePayload)},
		{"j-1", "sms", []byte{0, 0xff, 1, 2, 'x'}},
		{"j-2", "email", []byte(`{"to":"a@example.com"}`)},
		{"j-3", "sms", []byte(`{"to":"+15550100"}`)},
		{"j-4", "email", []byte(strings.Repeat("long ", 1000))},
	})
	return q
}

// Read-only: the pages list, filter and open dead letters, every broker
// string escaped; there is no write route and no form.
func TestReadOnly(t *testing.T) {
	for _, br := range brokers {
		t.Run(br.name, func(t *testing.T) {
			b := br.open(t)
			q := seeded(t, b, "ro")
			s := serve(t, b.Kind(), []queue.Queue{q}, console.WithPageSize(2))
			base := "/queues/" + q.Name()

			code, body := s.get("/")
			if code != http.StatusOK {
				t.Fatalf("overview: %d", code)
			}
			mustContain(t, "overview", body, q.Name(), `<td class="dlq">5</td>`, "read-only")

			// Paged: two a page, the cursor to the next, five in all.
			var ids []string
			path := base + "/dlq"
			for pages := 0; path != "" && pages < 5; pages++ {
				code, body = s.get(path)
				if code != http.StatusOK {
					t.Fatalf("%s: %d %s", path, code, body)
				}
				rows := regexp.MustCompile(`class="open" href="[^"]*">([^<]*)</a>`).FindAllStringSubmatch(body, -1)
				if len(rows) > 2 {
					t.Errorf("a page of 2 shows %d dead letters", len(rows))
				}
				for _, r := range rows {
					ids = append(ids, r[1])
				}
				path = ""
				if m := regexp.MustCompile(`id="next" href="([^"]*)"`).FindStringSubmatch(body); m != nil {
					path = strings.ReplaceAll(m[1], "&amp;", "&")
				}
			}
			if len(ids) != 5 {
				t.Errorf("the pages showed %v, want 5 dead letters", ids)
			}
			mustNotContain(t, "read-only list", body, `method="post"`, `name="csrf"`)

			// Hostile strings are text.
			_, body = s.get(base + "/dlq?id=j-0")
			mustContain(t, "list of j-0", body, "&lt;/textarea&gt;&lt;script&gt;")
			mustNotContain(t, "list of j-0", body, "<script>", "<img src=x")

			// A filter by type, and one by a time range that holds none.
			_, body = s.get(base + "/dlq?type=sms")
			if n := strings.Count(body, `class="letter"`); n != 2 {
				t.Errorf("type sms: %d rows, want 2", n)
			}
			_, body = s.get(base + "/dlq?until=2000-01-01T00:00")
			mustContain(t, "until 2000", body, `id="empty"`)
			if code, _ := s.get(base + "/dlq?since=yesterday"); code != http.StatusBadRequest {
				t.Errorf("since=yesterday: %d, want 400", code)
			}

			// One entry: the payload escaped inside its textarea, the last
			// error, the broker's record.
			code, body = s.get(base + "/dlq/entry?id=j-0")
			if code != http.StatusOK {
				t.Fatalf("entry j-0: %d %s", code, body)
			}
			mustContain(t, "entry j-0", body, "&lt;/textarea&gt;&lt;script&gt;document.title=&#34;pwned-payload&#34;", `id="last-error"`,
				"&lt;/textarea&gt;&lt;script&gt;document.title=&#34;pwned-error&#34;")
			if strings.Count(body, "</textarea>") != 1 {
				t.Errorf("entry j-0: %d </textarea>, want the page's one", strings.Count(body, "</textarea>"))
			}
			mustNotContain(t, "entry j-0", body, "<script", "<img src=x", `method="post"`)
			_, body = s.get(base + "/dlq/entry?id=j-1")
			mustContain(t, "entry j-1 (binary)", body, `id="binary"`, "00 ff 01 02 78")
			_, body = s.get(base + "/dlq/entry?id=j-4")
			mustContain(t, "entry j-4 (5000 bytes)", body, "5000 bytes")

			// No write route.
			for _, p := range []string{"/replay", "/discard", "/run"} {
				code, _, _ := s.post(base+p, url.Values{"id": {"j-0"}, "limit": {"1"}, "action": {"delete"}, "note": {"x"}})
				if code != http.StatusNotFound && code != http.StatusMethodNotAllowed {
					t.Errorf("read-only POST %s: %d, want 404 or 405", p, code)
				}
			}
			if n := dlqSize(t, q, 5); n != 5 {
				t.Errorf("after the read-only console: %d dead letters, want 5", n)
			}
			// The security headers.
			resp, err := http.Get(s.srv.URL + "/")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
				t.Errorf("CSP %q", csp)
			}
		})
	}
}

// Writable: every write needs the user's CSRF token; a delete needs a
// note and lands in the audit with the actor; a filtered replay runs at a
// rate to its end.
func TestWrites(t *testing.T) {
	for _, br := range brokers {
		t.Run(br.name, func(t *testing.T) {
			b := br.open(t)
			q := seeded(t, b, "rw")
			s := serve(t, b.Kind(), []queue.Queue{q}, console.WithWritable(true))
			base := "/queues/" + q.Name()
			del := url.Values{"action": {"delete"}, "id": {"j-2"}, "note": {"duplicate charge, ticket 7"}}

			// Refused without a token, with a wrong one, without a note.
			if code, _, _ := s.post(base+"/discard", del); code != http.StatusForbidden {
				t.Errorf("delete without a CSRF token: %d, want 403", code)
			}
			bad := url.Values{"csrf": {strings.Repeat("0", 64)}}
			for k, v := range del {
				bad[k] = v
			}
			if code, _, _ := s.post(base+"/discard", bad); code != http.StatusForbidden {
				t.Errorf("delete with a wrong CSRF token: %d, want 403", code)
			}
			tok := s.token(base + "/dlq")
			if code, _, _ := s.post(base+"/discard", url.Values{"csrf": {tok}, "action": {"delete"}, "id": {"j-2"}}); code != http.StatusBadRequest {
				t.Errorf("delete without a note: %d, want 400", code)
			}
			if n := dlqSize(t, q, 5); n != 5 {
				t.Fatalf("after the refused writes: %d dead letters, want 5", n)
			}

			// A delete with a note, seen in the audit with the actor.
			del.Set("csrf", tok)
			code, body, _ := s.post(base+"/discard", del)
			if code != http.StatusOK {
				t.Fatalf("delete: %d %s", code, body)
			}
			mustContain(t, "delete", body, "1 dead letters discarded")
			_, body = s.get(base + "/audit")
			mustContain(t, "audit", body, "j-2", "duplicate charge, ticket 7", "console:anonymous", "delete")

			// A replay of type sms at 100/s: two dead letters back.
			code, _, loc := s.post(base+"/replay", url.Values{"csrf": {tok}, "type": {"sms"}, "limit": {"10"}, "rate": {"100/s"}})
			if code != http.StatusSeeOther || !strings.HasPrefix(loc, "/replays/") {
				t.Fatalf("replay: %d, location %q", code, loc)
			}
			eventually.True(t, 30*time.Second, "the replay done", func() bool {
				_, body = s.get(loc)
				return strings.Contains(body, "Done:")
			})
			mustContain(t, "replay progress", body, `<span id="moved">2</span>`, `value="100"`)
			if n := dlqSize(t, q, 2); n != 2 {
				t.Errorf("after delete j-2 and replay of sms: %d dead letters, want 2", n)
			}
			// Each replayed dead letter is in the audit with the actor
			// (issue 46), beside the delete.
			_, body = s.get(base + "/audit")
			for _, id := range []string{"j-1", "j-3"} {
				mustContain(t, "audit after the replay", body, `<td>replay</td><td class="actor">console:anonymous</td><td>`+id+`</td>`)
			}
			// A token is the user's: another user's is refused.
			req, _ := http.NewRequest(http.MethodPost, s.srv.URL+base+"/run", strings.NewReader(url.Values{"csrf": {tok}, "id": {"x"}}.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.SetBasicAuth("mallory", "x")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("another user's token: %d, want 403", resp.StatusCode)
			}
		})
	}
}

// runSupported says which brokers' queue.Queue.Run can force-run a
// delayed job by id: both (issue 45: RabbitMQ takes it from the delay levels
// or the worker's mover). A broker without it must answer 501.
var runSupported = map[string]bool{"redis": true, "rabbitmq": true}

// Force run of a delayed job through the broker interface: the job runs
// again at once and the run is in the audit with the actor; a broker that
// cannot run one says so (501, not supported).
func TestForceRun(t *testing.T) {
	for _, br := range brokers {
		t.Run(br.name, func(t *testing.T) {
			b := br.open(t)
			q, err := b.Open("run-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 10))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if _, err := q.Enqueue(ctx, "later", []byte("x"), queue.EnqueueOptions{}); err != nil {
				t.Fatal(err)
			}
			var runs atomic.Int32
			failing := func(context.Context, queue.Job) error { runs.Add(1); return fmt.Errorf("upstream 503") }
			stop := work(t, q, `{"max_attempts": 5, "backoff": {"strategy": "constant", "base": "1h", "cap": "1h"}, "jitter": {"mode": "none"}}`, failing)
			defer stop()
			s := serve(t, b.Kind(), []queue.Queue{q}, console.WithWritable(true))
			tok := s.token("/queues/" + q.Name() + "/dlq")
			// Ran once and retried: waiting an hour in the delayed set
			// (RabbitMQ cannot count one queue's delayed jobs: nothing
			// left in its queue).
			eventually.True(t, 30*time.Second, "the job delayed", func() bool {
				st, err := q.Stats(ctx)
				return err == nil && runs.Load() == 1 && st.Jobs == 0 && (st.Delayed == nil || *st.Delayed == 1)
			})
			var code int
			var body string
			// On RabbitMQ the retry reaches a delay level or the worker's
			// mover a moment after the first run is acked: tried until then.
			eventually.True(t, 30*time.Second, "the job run now", func() bool {
				code, body, _ = s.post("/queues/"+q.Name()+"/run", url.Values{"csrf": {tok}, "id": {"later"}})
				return code != http.StatusOK || !strings.Contains(body, "is not delayed")
			})
			if !runSupported[b.Kind()] {
				if code != http.StatusNotImplemented || !strings.Contains(body, "not supported") {
					t.Errorf("run on %s: %d, want 501 saying not supported (if Run works there now, set runSupported[%q])", b.Kind(), code, b.Kind())
				}
				return
			}
			if code != http.StatusOK || !strings.Contains(body, "job later runs now") {
				t.Fatalf("run: %d %s", code, body)
			}
			eventually.True(t, 30*time.Second, "the job run again", func() bool { return runs.Load() == 2 })
			_, body = s.get("/queues/" + q.Name() + "/audit")
			mustContain(t, "audit after the run", body, `<td>run</td><td class="actor">console:anonymous</td><td>later</td>`)
		})
	}
}

// Bounded work: at most maxRunningReplays (4) replays run at once; one
// more is refused with 429 rather than starting another hour-long
// goroutine.
func TestRunningReplaysAreBounded(t *testing.T) {
	b := brokers[0].open(t)
	q := seeded(t, b, "bounded")
	s := serve(t, b.Kind(), []queue.Queue{q}, console.WithWritable(true))
	base := "/queues/" + q.Name()
	tok := s.token(base + "/dlq")
	// One dead letter an hour: each replay moves one, then waits.
	slow := url.Values{"csrf": {tok}, "limit": {"5"}, "rate": {"1/h"}}
	for i := range 4 {
		if code, body, _ := s.post(base+"/replay", slow); code != http.StatusSeeOther {
			t.Fatalf("replay %d: %d %s", i+1, code, body)
		}
	}
	code, body, _ := s.post(base+"/replay", slow)
	if code != http.StatusTooManyRequests || !strings.Contains(body, "4 replays are running") {
		t.Errorf("a fifth replay: %d %s, want 429", code, body)
	}
}

// Replay of the dead letters selected on a page (issue 46: one, selected,
// or a filter): each by its job id, paced; one already gone moves nothing
// and the others still go; each is in the audit with the actor.
func TestReplaySelected(t *testing.T) {
	for _, br := range brokers {
		t.Run(br.name, func(t *testing.T) {
			b := br.open(t)
			q := seeded(t, b, "sel")
			s := serve(t, b.Kind(), []queue.Queue{q}, console.WithWritable(true))
			base := "/queues/" + q.Name()
			_, page := s.get(base + "/dlq")
			mustContain(t, "the list", page, `name="ids" value="j-0" form="replay-selected"`, `id="replay-selected"`)
			tok := s.token(base + "/dlq")
			code, _, loc := s.post(base+"/replay", url.Values{"csrf": {tok}, "ids": {"j-0", "gone", "j-4"}, "rate": {"100/s"}})
			if code != http.StatusSeeOther || !strings.HasPrefix(loc, "/replays/") {
				t.Fatalf("replay of the selected: %d, location %q", code, loc)
			}
			var body string
			eventually.True(t, 30*time.Second, "the replay done", func() bool {
				_, body = s.get(loc)
				return strings.Contains(body, "Done:")
			})
			mustContain(t, "replay progress", body, `<span id="moved">2</span> of at most 3`)
			if n := dlqSize(t, q, 3); n != 3 {
				t.Errorf("after replaying 2 selected of 5: %d dead letters, want 3", n)
			}
			_, body = s.get(base + "/audit")
			for _, id := range []string{"j-0", "j-4"} {
				mustContain(t, "audit", body, `<td>replay</td><td class="actor">console:anonymous</td><td>`+id+`</td>`)
			}
			// Read-only: no selection offered.
			ro := serve(t, b.Kind(), []queue.Queue{q})
			if _, page := ro.get(base + "/dlq"); strings.Contains(page, `name="ids"`) {
				t.Errorf("a read-only list offers a selection")
			}
		})
	}
}
