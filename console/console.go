// Package console is backstop's web console for dead letters (issue 46):
// an overview of queues, a paged and filtered list of each DLQ, one dead
// letter, and, when writable, replay, delete, purge and force run, each
// write recorded in the queue's audit with the authenticated user. It
// reaches brokers through queue.Queue alone, so Redis and RabbitMQ look the
// same; cmd/backstop's `backstop console` serves it behind exporter-toolkit
// (TLS, basic auth).
//
// Safe by default: read-only unless WithWritable (a read-only console
// registers no write route and renders no form); every write carries a
// CSRF token bound to the user; every broker string goes through
// html/template; a request reads at most one page of a DLQ
// (queue.PageOptions bounds it).
package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/backstop-dev/backstop/exporter"
	"github.com/backstop-dev/backstop/queue"
)

//go:embed templates/*.html static/*
var assets embed.FS

// Server is the console, an http.Handler.
type Server struct {
	queues   map[string]queue.Queue
	order    []string
	kind     string
	cfg      config
	key      []byte // the CSRF tokens' HMAC key, new per process
	tmpl     *template.Template
	mux      *http.ServeMux
	mu       sync.Mutex
	replays  map[int]*replayJob
	replayID int
	running  int                // replays not done yet (maxRunningReplays)
	history  *history           // nil with a Prometheus or without WithExporter
	stop     context.CancelFunc // ends the history's sampling
	stopped  chan struct{}
}

type config struct {
	writable   bool
	prometheus string
	policy     string
	policyName string
	schedule   []byte
	log        *slog.Logger
	pageSize   int
	collector  *exporter.Collector
	every      time.Duration
}

// Option configures New.
type Option func(*config)

// WithWritable allows the writes (replay, delete, purge, force run);
// default read-only.
func WithWritable(on bool) Option { return func(c *config) { c.writable = on } }

// WithPrometheus reads the retry rate and DLQ ingestion of the last hour
// from the Prometheus at url (its HTTP API); default none.
func WithPrometheus(url string) Option { return func(c *config) { c.prometheus = url } }

// WithExporter samples the retries and DLQ ingestion of the queues from
// c (exporter.Collector.Totals: the readers of backstop_retries_total and
// backstop_dlq_ingested_total) every interval, from New to Close, into a
// history of an hour per queue of a fixed size; the overview shows the
// last hour's retry rate and DLQ ingestion from it, and since when it has
// samples. A page load reads the history, never the broker. Ignored with
// WithPrometheus, whose figures come first. interval is 1s to 30m (the
// exporter's scrape interval, 15s, is a good one); default none. The
// console does not close c.
func WithExporter(c *exporter.Collector, interval time.Duration) Option {
	return func(cfg *config) { cfg.collector, cfg.every = c, interval }
}

// WithPolicy shows the policy in force on the overview: its name, its
// text (JSON) and its schedule plot (SVG, served as an image; nil: none).
func WithPolicy(name, text string, scheduleSVG []byte) Option {
	return func(c *config) { c.policyName, c.policy, c.schedule = name, text, scheduleSVG }
}

// WithLogger logs every write with its actor (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

// WithPageSize is how many dead letters a list page shows (default 50,
// at most queue.MaxPageLimit).
func WithPageSize(n int) Option { return func(c *config) { c.pageSize = n } }

// New returns the console over qs (one broker, kind its queue.Broker's Kind).
func New(kind string, qs []queue.Queue, opts ...Option) (*Server, error) {
	cfg := config{log: slog.Default(), pageSize: 50}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.pageSize < 1 || cfg.pageSize > queue.MaxPageLimit {
		return nil, fmt.Errorf("console: page size must be in 1..%d, got %d", queue.MaxPageLimit, cfg.pageSize)
	}
	if len(qs) == 0 {
		return nil, fmt.Errorf("console: no queue")
	}
	s := &Server{queues: map[string]queue.Queue{}, kind: kind, cfg: cfg, key: make([]byte, 32), replays: map[int]*replayJob{}}
	if _, err := rand.Read(s.key); err != nil {
		return nil, err
	}
	for _, q := range qs {
		if _, dup := s.queues[q.Name()]; dup {
			return nil, fmt.Errorf("console: queue %q given twice", q.Name())
		}
		s.queues[q.Name()] = q
		s.order = append(s.order, q.Name())
	}
	sort.Strings(s.order)
	if cfg.collector != nil && cfg.prometheus == "" && (cfg.every < minSampleInterval || cfg.every > maxSampleInterval) {
		return nil, fmt.Errorf("console: sample interval must be in %v..%v, got %v", minSampleInterval, maxSampleInterval, cfg.every)
	}
	t, err := template.New("").Funcs(funcs).ParseFS(assets, "templates/*.html")
	if err != nil {
		return nil, err
	}
	s.tmpl = t
	static, _ := fs.Sub(assets, "static")
	m := http.NewServeMux()
	m.Handle("GET /static/", http.StripPrefix("/static/", http.FileServer(http.FS(static))))
	m.HandleFunc("GET /{$}", s.overview)
	if cfg.schedule != nil {
		m.HandleFunc("GET /policy.svg", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "image/svg+xml")
			w.Write(cfg.schedule)
		})
	}
	m.HandleFunc("GET /queues/{queue}/dlq", s.list)
	m.HandleFunc("GET /queues/{queue}/dlq/entry", s.entry)
	m.HandleFunc("GET /queues/{queue}/audit", s.audit)
	if cfg.writable {
		m.HandleFunc("POST /queues/{queue}/replay", s.write(s.replay))
		m.HandleFunc("GET /replays/{id}", s.replayProgress)
		m.HandleFunc("POST /queues/{queue}/discard", s.write(s.discard))
		m.HandleFunc("POST /queues/{queue}/run", s.write(s.run))
	}
	s.mux = m
	if cfg.collector != nil && cfg.prometheus == "" {
		s.history = newHistory(cfg.collector, cfg.every, s.order)
		ctx, cancel := context.WithCancel(context.Background())
		s.stop, s.stopped = cancel, make(chan struct{})
		go func() { defer close(s.stopped); s.history.run(ctx) }()
	}
	return s, nil
}

// Close stops sampling the history (WithExporter) and waits for the
// sample under way; the console serves on, its history no longer moving.
func (s *Server) Close() error {
	if s.stop != nil {
		s.stop()
		<-s.stopped
	}
	return nil
}

// ServeHTTP serves the console with headers that keep a page inert: no
// script but the console's own, no framing, no sniffing.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	s.mux.ServeHTTP(w, r)
}

// actor is who makes a request: the user exporter-toolkit's basic auth let
// in, else "anonymous" (a console without basic auth).
func actor(r *http.Request) string {
	if u, _, ok := r.BasicAuth(); ok && u != "" {
		return "console:" + u
	}
	return "console:anonymous"
}

// csrf is the token of r's user: an HMAC of the actor under the
// process's key, so a token neither outlives the process nor serves
// another user.
func (s *Server) csrf(r *http.Request) string {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(actor(r)))
	return hex.EncodeToString(m.Sum(nil))
}

// write wraps a write: a POST with the user's CSRF token, same origin
// when the browser says where it comes from.
func (s *Server) write(h func(http.ResponseWriter, *http.Request, queue.Queue)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		if err := r.ParseForm(); err != nil {
			http.Error(w, "bad form", http.StatusBadRequest)
			return
		}
		tok := r.PostForm.Get("csrf")
		if tok == "" || !hmac.Equal([]byte(tok), []byte(s.csrf(r))) {
			http.Error(w, "refused: missing or wrong CSRF token", http.StatusForbidden)
			return
		}
		if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
			http.Error(w, "refused: cross-site request", http.StatusForbidden)
			return
		}
		q, ok := s.queue(w, r)
		if !ok {
			return
		}
		h(w, r, q)
	}
}

func (s *Server) queue(w http.ResponseWriter, r *http.Request) (queue.Queue, bool) {
	q, ok := s.queues[r.PathValue("queue")]
	if !ok {
		http.Error(w, "no such queue", http.StatusNotFound)
	}
	return q, ok
}

// page is what every template gets.
type page struct {
	Title    string
	Kind     string
	Queues   []string
	Queue    string
	Writable bool
	CSRF     string
	Error    string
	Refresh  bool // reload every second (a replay's progress)
	Data     any
}

func (s *Server) render(w http.ResponseWriter, r *http.Request, name string, status int, p page) {
	p.Kind, p.Queues, p.Writable = s.kind, s.order, s.cfg.writable
	if s.cfg.writable {
		p.CSRF = s.csrf(r)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := s.tmpl.ExecuteTemplate(w, name, p); err != nil {
		s.cfg.log.Error("console render failed", "template", name, "err", err)
	}
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	s.render(w, r, "error.html", status, page{Title: "Error", Error: err.Error()})
}

// requestCtx bounds a request's broker work.
func requestCtx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), 30*time.Second)
}

func atoiOr(s string, def int) int {
	if n, err := strconv.Atoi(s); err == nil {
		return n
	}
	return def
}
