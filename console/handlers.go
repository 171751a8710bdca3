package console

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/backstop-dev/backstop/queue"
)

// queueRow is one queue on the overview.
type queueRow struct {
	Name                string
	Jobs, DeadLetters   int64
	Held, Delayed       *int64
	Names               queue.Names
	RetryRate, Ingested string // from Prometheus, "" without one
	Err                 string
}

func (s *Server) overview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := requestCtx(r)
	defer cancel()
	var rows []queueRow
	retries, ingested := s.promByQueue(ctx, "sum by (queue) (rate(backstop_retries_total[1h]))"),
		s.promByQueue(ctx, "sum by (queue) (increase(backstop_dlq_ingested_total[1h]))")
	var hist historyView
	if s.history != nil {
		retries, ingested, hist = s.historyByQueue()
	}
	for _, name := range s.order {
		q := s.queues[name]
		row := queueRow{Name: name, Names: q.Names(), RetryRate: retries[name], Ingested: ingested[name]}
		st, err := q.Stats(ctx)
		if err != nil {
			row.Err = err.Error()
		} else {
			row.Jobs, row.DeadLetters, row.Held, row.Delayed = st.Jobs, st.DeadLetters, st.Held, st.Delayed
		}
		rows = append(rows, row)
	}
	s.render(w, r, "overview.html", http.StatusOK, page{Title: "Overview", Data: map[string]any{
		"Rows": rows, "Policy": s.cfg.policy, "PolicyName": s.cfg.policyName, "Schedule": s.cfg.schedule != nil,
		"Prometheus": s.cfg.prometheus != "", "Rates": s.cfg.prometheus != "" || s.history != nil, "History": hist}})
}

// historyView is what the overview says of its own history (WithExporter).
type historyView struct {
	On         bool
	Every      time.Duration
	Since      time.Time     // the first sample; zero: none yet
	Span       time.Duration // how much of the hour the figures cover
	Full       bool          // the samples reach back an hour (rates.Full)
	UpperBound bool          // a retry figure is RabbitMQ's upper bound
	Err        string        // the last sample's error
}

// historyByQueue returns the last hour's retries per second and dead
// letters added per queue from the history, as the Prometheus queries
// would give them, and what the overview says of the history. A queue
// with fewer than two samples has no figure yet.
func (s *Server) historyByQueue() (retries, ingested map[string]string, v historyView) {
	rs, since, err := s.history.read()
	v = historyView{On: true, Every: s.history.every, Since: since, Err: err}
	retries, ingested = map[string]string{}, map[string]string{}
	for q, r := range rs {
		v.Span = max(v.Span, r.Span)
		v.Full = v.Full || r.Full
		if r.RetriesOK {
			retries[q] = strconv.FormatFloat(r.Retries, 'g', 4, 64)
			if r.RetriesUpperBound {
				retries[q] = "≤ " + retries[q]
				v.UpperBound = true
			}
		}
		if r.IngOK {
			ingested[q] = strconv.FormatInt(r.Ingested, 10)
		}
	}
	return retries, ingested, v
}

// promByQueue runs an instant query and returns its values by queue
// label; nil without a Prometheus or on any error (the overview goes on).
func (s *Server) promByQueue(ctx context.Context, query string) map[string]string {
	if s.cfg.prometheus == "" {
		return nil
	}
	u := strings.TrimRight(s.cfg.prometheus, "/") + "/api/v1/query?query=" + url.QueryEscape(query)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.cfg.log.Warn("console prometheus query failed", "err", errors.Unwrap(err))
		return nil
	}
	defer resp.Body.Close()
	var body struct {
		Data struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&body) != nil {
		return nil
	}
	out := map[string]string{}
	for _, r := range body.Data.Result {
		if v, ok := r.Value[1].(string); ok {
			out[r.Metric["queue"]] = v
		}
	}
	return out
}

// filter is a list's filter as the query string holds it.
type filter struct {
	Reason, Type, ID, Since, Until string
}

func (f filter) query() url.Values {
	v := url.Values{}
	for k, x := range map[string]string{"reason": f.Reason, "type": f.Type, "id": f.ID, "since": f.Since, "until": f.Until} {
		if x != "" {
			v.Set(k, x)
		}
	}
	return v
}

// options reads the filter into o; times are RFC 3339 or the browser's
// datetime-local (UTC).
func (f filter) options(o *queue.PageOptions) error {
	o.Reason, o.JobType, o.ID = f.Reason, f.Type, f.ID
	for _, t := range []struct {
		s   string
		dst *time.Time
		n   string
	}{{f.Since, &o.Since, "since"}, {f.Until, &o.Until, "until"}} {
		if t.s == "" {
			continue
		}
		v, err := time.Parse(time.RFC3339, t.s)
		if err != nil {
			v, err = time.Parse("2006-01-02T15:04", t.s)
		}
		if err != nil {
			return fmt.Errorf("%s must be a time (2006-01-02T15:04 UTC or RFC 3339), got %q", t.n, t.s)
		}
		*t.dst = v
	}
	return nil
}

func filterOf(r *http.Request) filter {
	q := r.URL.Query()
	if r.Method == http.MethodPost {
		q = r.PostForm
	}
	return filter{Reason: q.Get("reason"), Type: q.Get("type"), ID: q.Get("id"), Since: q.Get("since"), Until: q.Get("until")}
}

// letterView is a dead letter as the templates show it.
type letterView struct {
	queue.Letter
	Text    string // the preview as text, when it is UTF-8
	Binary  bool
	Hex     string // the preview's first bytes in hex, when binary
	Cut     bool   // the preview is shorter than the payload
	Link    string
	Headers [][2]string
}

func viewOf(qname string, l queue.Letter) letterView {
	v := letterView{Letter: l, Cut: len(l.Payload) < l.PayloadSize}
	if utf8.Valid(l.Payload) && !strings.ContainsRune(string(l.Payload), 0) {
		v.Text = string(l.Payload)
	} else {
		v.Binary = true
		v.Hex = hex.Dump(l.Payload[:min(len(l.Payload), 256)])
	}
	q := url.Values{"id": {l.JobID}}
	if l.Cursor != "" {
		q.Set("at", l.Cursor)
	}
	v.Link = "/queues/" + url.PathEscape(qname) + "/dlq/entry?" + q.Encode()
	for _, k := range sortedKeys(l.Fields) {
		v.Headers = append(v.Headers, [2]string{k, l.Fields[k]})
	}
	return v
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q, ok := s.queue(w, r)
	if !ok {
		return
	}
	ctx, cancel := requestCtx(r)
	defer cancel()
	f := filterOf(r)
	o := queue.PageOptions{Cursor: r.URL.Query().Get("cursor"), Limit: s.cfg.pageSize, Preview: 120}
	if err := f.options(&o); err != nil {
		s.fail(w, r, http.StatusBadRequest, err)
		return
	}
	p, err := q.Page(ctx, o)
	if err != nil {
		s.fail(w, r, http.StatusBadGateway, err)
		return
	}
	var letters []letterView
	for _, l := range p.Letters {
		letters = append(letters, viewOf(q.Name(), l))
	}
	next := ""
	if p.Next != "" {
		v := f.query()
		v.Set("cursor", p.Next)
		next = "/queues/" + url.PathEscape(q.Name()) + "/dlq?" + v.Encode()
	}
	s.render(w, r, "list.html", http.StatusOK, page{Title: "Dead letters of " + q.Name(), Queue: q.Name(), Data: map[string]any{
		"Letters": letters, "Next": next, "Scanned": p.Scanned, "Newest": p.Newest, "Filter": f,
		"Filtered": f != filter{}, "First": o.Cursor == ""}})
}

func (s *Server) entry(w http.ResponseWriter, r *http.Request) {
	q, ok := s.queue(w, r)
	if !ok {
		return
	}
	ctx, cancel := requestCtx(r)
	defer cancel()
	id, at := r.URL.Query().Get("id"), r.URL.Query().Get("at")
	if id == "" {
		s.fail(w, r, http.StatusBadRequest, errors.New("a dead letter is named by its job id (id=)"))
		return
	}
	o := queue.PageOptions{Cursor: at, Limit: 1, ID: id, Preview: 16 << 10}
	if at == "" {
		o.Scan = queue.MaxPageScan // found by id: bounded all the same
	}
	p, err := q.Page(ctx, o)
	if err != nil {
		s.fail(w, r, http.StatusBadGateway, err)
		return
	}
	if len(p.Letters) == 0 {
		s.fail(w, r, http.StatusNotFound, fmt.Errorf("no dead letter of job %q among the %d looked at", id, p.Scanned))
		return
	}
	s.render(w, r, "entry.html", http.StatusOK, page{Title: "Dead letter " + id, Queue: q.Name(),
		Data: viewOf(q.Name(), p.Letters[0])})
}

func (s *Server) audit(w http.ResponseWriter, r *http.Request) {
	q, ok := s.queue(w, r)
	if !ok {
		return
	}
	ctx, cancel := requestCtx(r)
	defer cancel()
	recs, err := q.Audit(ctx, 100)
	if err != nil {
		s.fail(w, r, http.StatusBadGateway, err)
		return
	}
	s.render(w, r, "audit.html", http.StatusOK, page{Title: "Audit of " + q.Name(), Queue: q.Name(), Data: recs})
}

// result shows what a write did.
func (s *Server) result(w http.ResponseWriter, r *http.Request, q queue.Queue, msg string) {
	s.render(w, r, "result.html", http.StatusOK, page{Title: "Done", Queue: q.Name(), Data: msg})
}

func (s *Server) discard(w http.ResponseWriter, r *http.Request, q queue.Queue) {
	ctx, cancel := requestCtx(r)
	defer cancel()
	f := filterOf(r)
	o := queue.DiscardOptions{Action: queue.DiscardAction(r.PostForm.Get("action")), ID: f.ID, Reason: f.Reason,
		JobType: f.Type, Limit: atoiOr(r.PostForm.Get("limit"), 0), Note: strings.TrimSpace(r.PostForm.Get("note")), Actor: actor(r)}
	if err := queue.CheckDiscard(o.Action, o.ID, o.Note, o.Actor, o.Limit); err != nil {
		s.fail(w, r, http.StatusBadRequest, err)
		return
	}
	n, err := q.Discard(ctx, o)
	s.cfg.log.Info("console discard", "queue", q.Name(), "action", o.Action, "actor", o.Actor, "discarded", n, "err", err)
	if err != nil {
		s.fail(w, r, http.StatusBadGateway, fmt.Errorf("%d discarded, then: %w", n, err))
		return
	}
	s.result(w, r, q, fmt.Sprintf("%s: %d dead letters discarded, each recorded in the audit %s.", o.Action, n, q.Names().Audit))
}

func (s *Server) run(w http.ResponseWriter, r *http.Request, q queue.Queue) {
	ctx, cancel := requestCtx(r)
	defer cancel()
	id := r.PostForm.Get("id")
	if id == "" {
		s.fail(w, r, http.StatusBadRequest, errors.New("force run needs the delayed job's id"))
		return
	}
	// Through the broker interface: whichever broker can run a delayed
	// job does, each one recorded in the audit with the actor.
	res, err := q.Run(ctx, queue.RunOptions{ID: id, Actor: actor(r)})
	s.cfg.log.Info("console force run", "queue", q.Name(), "id", id, "actor", actor(r), "moved", res.Moved, "err", err)
	if errors.Is(err, queue.ErrUnsupported) {
		s.fail(w, r, http.StatusNotImplemented, err)
		return
	}
	if err != nil {
		s.fail(w, r, http.StatusBadGateway, err)
		return
	}
	if res.Moved == 0 {
		s.result(w, r, q, fmt.Sprintf("job %s is not delayed: nothing moved.", id))
		return
	}
	s.result(w, r, q, fmt.Sprintf("job %s runs now: %d moved to the jobs.", id, res.Moved))
}

var funcs = template.FuncMap{
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "unknown"
		}
		return t.UTC().Format("2006-01-02 15:04:05 UTC")
	},
	"opt": func(n *int64) string {
		if n == nil {
			return "n/a"
		}
		return fmt.Sprint(*n)
	},
	"esc":   url.PathEscape,
	"span":  func(d time.Duration) string { return d.Round(time.Second).String() },
	"query": func(f filter) string { return f.query().Encode() },
}
