package exporter

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/backstop-dev/backstop/internal/ctxtime"
	"github.com/backstop-dev/backstop/internal/redact"
	"github.com/backstop-dev/backstop/queue/rabbitmq/rabbitnames"
	"github.com/prometheus/client_golang/prometheus/collectors/version"
)

// The metrics only RabbitMQ has. The others keep the names they have for
// Redis where they mean the same (see NewRabbitMQCollector).
var (
	rabbitConsumersDesc = newDesc("rabbitmq_consumers", "Consumers of the work queue (RabbitMQ management API, consumers).", "queue")
	rabbitHeadAgeDesc   = newDesc("rabbitmq_head_message_age_seconds", "Age of the work queue's first message, from its timestamp property (management API head_message_timestamp). Only where the broker reports it: classic queues whose head message carries a timestamp; never for quorum queues on RabbitMQ 3.10, backstop's topology.", "queue")
	rabbitDelayDesc     = newDesc("rabbitmq_delay_messages", "Messages in the shared delay level <level> (2^level s): its hold queue backstop.hold.L<level>, waiting or held by the workers' movers, and the first topology's TTL queue backstop.delay.L<level>, every work queue's together: the exact total of the delayed messages of the virtual host.", "level")
)

// rabbitConfig is the RabbitMQ side of a Collector's configuration.
type rabbitConfig struct {
	user, password string
	auth           bool // user and password were given (WithRabbitMQCredentials)
	vhost          string
	pattern        *regexp.Regexp
	patternErr     error
}

// WithRabbitMQCredentials sets the user and password of the management
// API (HTTP basic auth) of a RabbitMQ collector; they override the URL's
// userinfo. Ignored by a Redis collector.
func WithRabbitMQCredentials(user, password string) Option {
	return func(c *config) { c.rabbit().user, c.rabbit().password, c.rabbit().auth = user, password, true }
}

// WithRabbitMQVHost sets the virtual host whose queues a RabbitMQ
// collector reads (default "/").
func WithRabbitMQVHost(vhost string) Option {
	return func(c *config) { c.rabbit().vhost = vhost }
}

// WithRabbitMQPattern makes a RabbitMQ collector report, besides the
// queues of WithQueues, every work queue of the virtual host whose whole
// name matches the regular expression re (RE2 syntax). A work queue is
// one declared with backstop's topology: its x-dead-letter-routing-key is
// its DLQ (rabbitnames.For), which leaves out the DLQs, the delay levels and
// queues of other software. Discovery costs nothing more: the scrape
// reads every queue of the virtual host in one request anyway.
func WithRabbitMQPattern(re string) Option {
	return func(c *config) {
		r, err := regexp.Compile("^(?:" + re + ")$")
		c.rabbit().pattern, c.rabbit().patternErr = r, err
	}
}

func (c *config) rabbit() *rabbitConfig {
	if c.rmq == nil {
		c.rmq = &rabbitConfig{vhost: "/"}
	}
	return c.rmq
}

// rabbitSource is where a RabbitMQ collector reads: the management API.
type rabbitSource struct {
	base   *url.URL // the management API, without userinfo
	user   string
	pass   string
	auth   bool
	vhost  string
	names  []string // the configured work queues, sorted
	match  *regexp.Regexp
	client *http.Client
	cfg    *config // the collector's

	mu       sync.Mutex
	arrivals map[string]*arrivals // per work queue: backstop_oldest_job_age_seconds
}

// NewRabbitMQCollector returns a collector of backstop's queues on
// RabbitMQ (the topology of queue/rabbitmq/README.md) that reads the
// management API at mgmtURL (http://host:15672, or https; a user and
// password in the URL are used unless WithRabbitMQCredentials gives
// them). Queues come from WithQueues (only their names are used) and
// WithRabbitMQPattern. It does not contact the broker: a broker that is
// down is reported by the scrapes (backstop_up 0).
//
// Every scrape makes two requests whatever the number of queues,
// /api/queues/<vhost> and /api/exchanges/<vhost> with only the columns it
// reads, at once and under the time budget (WithTimeout). Per work queue
// Q it reports:
//
//   - backstop_stream_lag_jobs{queue=Q,group=""}: Q's messages_ready,
//     jobs not delivered yet, as the lag of a consumer group is for Redis;
//     the group label is empty because a queue has no groups;
//   - backstop_stream_pending_jobs{queue=Q,group=""}: Q's
//     messages_unacknowledged, jobs delivered and not finished;
//   - backstop_rabbitmq_consumers{queue=Q};
//   - backstop_dlq_size{queue=Q}: messages in Q.dlq;
//   - backstop_dlq_ingested_total{queue=Q}: Q.dlq's message_stats.publish,
//     the dead letters workers published to it. RabbitMQ 3.10 counts only
//     messages published by clients: a message the broker dead-letters
//     itself (x-delivery-limit, when a worker died before it could
//     dead-letter a crash loop) is in backstop_dlq_size but not in this
//     counter. The management statistics start again from 0 when the
//     broker restarts: Prometheus reads that as a counter reset;
//   - backstop_dlq_discarded_total{queue=Q}: Q.audit's
//     message_stats.publish, the dead letters `backstop dlq delete|purge`
//     discarded (recorded there first), once Q.audit exists;
//   - backstop_delayed_queue_size{queue=Q}: an estimate, clamped at 0,
//     from what entered and left the delay for Q (see delayedEstimate);
//   - backstop_oldest_job_age_seconds{queue=Q}: how long Q's oldest
//     message (ready or unacked) has been in Q, from Q's arrival counts
//     over the scrapes (arrivals.go): a lower bound, at most the
//     exporter's uptime, with no message read (a peek would count a
//     delivery); the delay levels are not in it;
//   - backstop_rabbitmq_head_message_age_seconds{queue=Q}, where the
//     broker reports head_message_timestamp (never for quorum queues on
//     3.10).
//
// and for the virtual host backstop_rabbitmq_delay_messages{level}, the
// exact depth of each shared delay level. The exporter's health metrics
// (backstop_up, backstop_scrape_*) are those of a Redis collector.
//
// What the broker cannot know, attempts by outcome, retries and dead
// letters by reason and the attempt distribution, comes from the workers'
// own metrics (same names, queue/rabbitmq/README.md).
//
// # Errors
//
// A URL that is not http(s) with a host, a bad pattern, no queue and no
// pattern, a queue name that cannot be a label value, a budget that is
// not positive.
func NewRabbitMQCollector(mgmtURL string, opts ...Option) (*Collector, error) {
	cfg := defaults()
	for _, o := range opts {
		o(&cfg)
	}
	rc := cfg.rabbit()
	if cfg.log == nil {
		cfg.log = slog.New(slog.DiscardHandler)
	}
	if cfg.pattern != "" {
		return nil, errors.New("exporter: WithPattern discovers Redis keys: use WithRabbitMQPattern")
	}
	if cfg.timeout <= 0 {
		return nil, fmt.Errorf("exporter: timeout must be positive, got %v", cfg.timeout)
	}
	u, err := url.Parse(mgmtURL)
	if err != nil {
		return nil, fmt.Errorf("exporter: rabbitmq url: %w", redact.Error(err, mgmtURL))
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("exporter: rabbitmq url %q: must be http:// or https:// with a host (the management API, e.g. http://localhost:15672)", redact.URL(mgmtURL))
	}
	src := &rabbitSource{vhost: rc.vhost, match: rc.pattern}
	if u.User != nil {
		src.user = u.User.Username()
		src.pass, _ = u.User.Password()
		src.auth = true
		u.User = nil
	}
	if rc.auth {
		src.user, src.pass, src.auth = rc.user, rc.password, true
	}
	u.Path = strings.TrimRight(u.Path, "/")
	src.base = u
	if rc.patternErr != nil {
		return nil, fmt.Errorf("exporter: rabbitmq queue pattern: %w", rc.patternErr)
	}
	if src.vhost == "" {
		return nil, errors.New("exporter: rabbitmq vhost must not be empty (the default is \"/\")")
	}
	// The scrape's context bounds each request: no client timeout.
	src.client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	seen := map[string]bool{}
	for _, q := range cfg.queues {
		if q.Name == "" {
			return nil, errors.New("exporter: queue name must not be empty")
		}
		if err := validName(q.Name); err != nil {
			return nil, fmt.Errorf("exporter: queue name %q %w", q.Name, err)
		}
		if seen[q.Name] {
			return nil, fmt.Errorf("exporter: queue %q given twice", q.Name)
		}
		seen[q.Name] = true
		src.names = append(src.names, q.Name)
	}
	slices.Sort(src.names)
	if len(src.names) == 0 && src.match == nil {
		return nil, errors.New("exporter: no queues: give WithQueues or WithRabbitMQPattern")
	}
	cfg.queues = nil
	for _, n := range src.names {
		cfg.queues = append(cfg.queues, Queue{Name: n})
	}
	c := &Collector{cfg: cfg, build: version.NewCollector("backstop_exporter"), errs: map[string]float64{}}
	src.cfg = &c.cfg
	c.src = src
	return c, nil
}

// mgmtQueue is the part of /api/queues the exporter reads.
type mgmtQueue struct {
	Name      string         `json:"name"`
	Messages  int64          `json:"messages"`
	Ready     int64          `json:"messages_ready"`
	Unacked   int64          `json:"messages_unacknowledged"`
	Consumers int64          `json:"consumers"`
	HeadTS    *float64       `json:"head_message_timestamp"` // unix seconds; absent when unknown
	Arguments map[string]any `json:"arguments"`
	Stats     mgmtStats      `json:"message_stats"`
}

// mgmtStats are cumulative counts since the broker started. The API sends
// [] instead of {} for a queue without any: UnmarshalJSON takes both.
type mgmtStats struct {
	Publish      int64 `json:"publish"`
	PublishIn    int64 `json:"publish_in"`
	Ack          int64 `json:"ack"`
	GetNoAck     int64 `json:"get_no_ack"`
	DeliverNoAck int64 `json:"deliver_no_ack"`
}

func (s *mgmtStats) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '[' {
		return nil
	}
	type plain mgmtStats
	return json.Unmarshal(b, (*plain)(s))
}

// removed is what left the queue for good by a client: acked, or taken
// without an ack.
func (s mgmtStats) removed() int64 { return s.Ack + s.GetNoAck + s.DeliverNoAck }

type mgmtExchange struct {
	Name  string    `json:"name"`
	Stats mgmtStats `json:"message_stats"`
}

const (
	queueColumns    = "name,messages,messages_ready,messages_unacknowledged,consumers,head_message_timestamp,arguments,message_stats.publish,message_stats.ack,message_stats.get_no_ack,message_stats.deliver_no_ack"
	exchangeColumns = "name,message_stats.publish_in"
)

// errRabbitAuth is a 401 from the management API.
var errRabbitAuth = errors.New("rabbitmq management api: 401 unauthorized (check the user and password)")

// rabbitReplyError is any other answer than 200 from the management API,
// or a body that is not the JSON it should be.
type rabbitReplyError struct{ msg string }

func (e *rabbitReplyError) Error() string { return e.msg }

// get reads one list of the management API into out.
func (r *rabbitSource) get(ctx context.Context, kind, columns string, out any) error {
	u := *r.base
	u.Path = r.base.Path + "/api/" + kind + "/" + r.vhost
	u.RawPath = r.base.EscapedPath() + "/api/" + kind + "/" + url.PathEscape(r.vhost) // "/" is %2F
	u.RawQuery = "columns=" + columns
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	if r.auth {
		req.SetBasicAuth(r.user, r.pass)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return fmt.Errorf("rabbitmq management api: %w", err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusUnauthorized:
		return errRabbitAuth
	case http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout:
		// A node still booting or gone, or a proxy in front of it: down.
		return fmt.Errorf("rabbitmq management api: GET /api/%s/%s: %s", kind, r.vhost, resp.Status)
	default:
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return &rabbitReplyError{fmt.Sprintf("rabbitmq management api: GET /api/%s/%s: %s: %s", kind, r.vhost, resp.Status, strings.TrimSpace(string(b)))}
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return &rabbitReplyError{fmt.Sprintf("rabbitmq management api: GET /api/%s/%s: decode: %v", kind, r.vhost, err)}
	}
	return nil
}

// rabbitState is one reading of the management API.
type rabbitState struct {
	queues    map[string]*mgmtQueue
	exchanges map[string]mgmtStats
	work      []string // the work queues to report, sorted
}

// read makes the scrape's two requests at once.
func (r *rabbitSource) read(ctx context.Context) (*rabbitState, error) {
	var qs []mgmtQueue
	var xs []mgmtExchange
	xerr := make(chan error, 1)
	go func() { xerr <- r.get(ctx, "exchanges", exchangeColumns, &xs) }()
	qerr := r.get(ctx, "queues", queueColumns, &qs)
	if err := cmp.Or(qerr, <-xerr); err != nil { // both fail alike: one is enough
		return nil, err
	}
	st := &rabbitState{queues: make(map[string]*mgmtQueue, len(qs)), exchanges: make(map[string]mgmtStats, len(xs))}
	for i := range qs {
		st.queues[qs[i].Name] = &qs[i]
	}
	for _, x := range xs {
		st.exchanges[x.Name] = x.Stats
	}
	st.work = slices.Clone(r.names)
	if r.match != nil {
		for _, q := range qs {
			if r.match.MatchString(q.Name) && isWorkQueue(&q) && validName(q.Name) == nil && !slices.Contains(r.names, q.Name) {
				st.work = append(st.work, q.Name)
			}
		}
		slices.Sort(st.work)
	}
	return st, nil
}

// isWorkQueue reports a queue declared with backstop's topology: it
// dead-letters to its own DLQ.
func isWorkQueue(q *mgmtQueue) bool {
	rk, _ := q.Arguments["x-dead-letter-routing-key"].(string)
	return rk == rabbitnames.For(q.Name).DLQ
}

// delayedEstimate is how many messages of work queue q are in the delay,
// from the cumulative counts of the management API: what clients
// published to q.delay, minus what arrived in q from the delay. The
// arrivals are not counted by RabbitMQ 3.10 (it counts client publishes
// only, and the delay's last hop is the broker dead-lettering from level
// L0 into q.due), so they are worked out from what q and q.dlq hold and
// lost for good:
//
//	arrived(q)  = in(q) − publish(q)
//	in(q)       = messages(q) + removed(q) + brokerDeadLettered(q)
//	brokerDL(q) = messages(q.dlq) + removed(q.dlq) − publish(q.dlq)
//
// where removed is acked or taken without an ack. It is exact while the
// broker runs and nobody purges or deletes q or q.dlq; the statistics lag
// the queue depths by up to the statistics interval (5 s), so under
// traffic it is off by what moved in that time. After a broker restart
// the counts start from 0 but the messages stay, so it reads 0 (clamped)
// until the delayed messages of before the restart have arrived; the
// exact total of the virtual host is backstop_rabbitmq_delay_messages.
func (st *rabbitState) delayedEstimate(q string) (int64, bool) {
	names := rabbitnames.For(q)
	delay, ok := st.exchanges[names.Delay]
	if !ok {
		return 0, false
	}
	work := st.queues[q]
	arrived := st.arrived(q) - work.Stats.Publish
	return max(delay.PublishIn-arrived, 0), true
}

// arrived is how many messages entered work queue q (which exists) since
// the broker started: what it holds, what left it acked or taken, and what
// the broker dead-lettered from it (delayedEstimate).
func (st *rabbitState) arrived(q string) int64 {
	work := st.queues[q]
	var dlqIn int64
	if dlq := st.queues[rabbitnames.For(q).DLQ]; dlq != nil {
		dlqIn = dlq.Messages + dlq.Stats.removed() - dlq.Stats.Publish
	}
	return work.Messages + work.Stats.removed() + max(dlqIn, 0)
}

// oldestAge is the age of work queue q's oldest message (ready or held by
// a worker), from its arrival curve (arrivals.go); only the work queues of
// this scrape keep one.
func (r *rabbitSource) oldestAge(st *rabbitState, q string, now time.Time) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.arrivals == nil {
		r.arrivals = map[string]*arrivals{}
	}
	a := r.arrivals[q]
	if a == nil {
		a = &arrivals{}
		r.arrivals[q] = a
	}
	return a.observe(now, st.arrived(q), st.queues[q].Messages).Seconds()
}

// forget drops the arrival curves of the queues a scrape no longer
// reports (deleted, or no longer matched).
func (r *rabbitSource) forget(work []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for q := range r.arrivals {
		if !slices.Contains(work, q) {
			delete(r.arrivals, q)
		}
	}
}

// scrape reads the management API once (two requests) and reports every
// work queue and delay level.
func (r *rabbitSource) scrape(ctx context.Context, s *sink) int {
	var st *rabbitState
	var err error
	if !ctxtime.Within(ctx, func() { st, err = r.read(ctx) }) {
		err = ctx.Err()
	}
	if err != nil {
		kind := rabbitKindOf(err)
		s.kinds[kind] = err // health logs it, counts it and says up 0
		if kind == kindReply {
			s.log.Warn("reading the management api failed", "kind", kind, "err", err)
		}
		return 0
	}
	s.pinged = true
	now := r.cfg.now()
	for _, name := range st.work {
		q := st.queues[name]
		if s.queueFound == nil {
			s.queueFound = map[string]bool{}
		}
		s.queueFound[name] = q != nil // a misspelt --queues, or not declared yet: noteFound warns
		found := 0.0
		if q != nil {
			found = 1
		}
		s.gauge(queueFoundDesc, found, name)
		if q == nil {
			continue // not declared yet: Declare, Enqueue or Work will
		}
		s.gauge(lagDesc, float64(q.Ready), name, "")
		s.gauge(pendingDesc, float64(q.Unacked), name, "")
		s.gauge(rabbitConsumersDesc, float64(q.Consumers), name)
		if q.HeadTS != nil {
			s.gauge(rabbitHeadAgeDesc, max(now.Sub(time.Unix(int64(*q.HeadTS), 0)).Seconds(), 0), name)
		}
		if dlq := st.queues[rabbitnames.For(name).DLQ]; dlq != nil {
			s.gauge(dlqSizeDesc, float64(dlq.Messages), name)
			s.counter(dlqIngestedDesc, float64(dlq.Stats.Publish), name)
		}
		if audit := st.queues[rabbitnames.For(name).Audit]; audit != nil {
			s.counter(discardedDesc, float64(audit.Stats.Publish), name)
		}
		if n, ok := st.delayedEstimate(name); ok {
			s.gauge(delayedSizeDesc, float64(n), name)
		}
		s.gauge(oldestJobDesc, r.oldestAge(st, name, now), name)
	}
	r.forget(st.work)
	for level := 0; level < 64; level++ {
		lq, hq := st.queues[rabbitnames.DelayLevel(level)], st.queues[rabbitnames.HoldLevel(level)]
		if lq == nil && hq == nil {
			break // the levels are declared together, 0 up
		}
		var n int64
		for _, q := range []*mgmtQueue{lq, hq} {
			if q != nil {
				n += q.Messages
			}
		}
		s.gauge(rabbitDelayDesc, float64(n), strconv.Itoa(level))
	}
	return len(st.work)
}

// rabbitKindOf is the backstop_scrape_errors_total kind of a failed read.
func rabbitKindOf(err error) string {
	var reply *rabbitReplyError
	var netErr net.Error
	switch {
	case errors.Is(err, errRabbitAuth):
		return kindAuth
	case errors.As(err, &reply):
		return kindReply
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return kindTimeout
	case errors.As(err, &netErr) && netErr.Timeout():
		return kindTimeout
	}
	return kindConnection
}

// dlqIngestion is DLQIngestion for RabbitMQ: the figures of the scrape,
// from one reading of the management API.
func (r *rabbitSource) dlqIngestion(ctx context.Context) ([]DLQIngestion, error) {
	st, err := r.read(ctx)
	if err != nil {
		return nil, err
	}
	var out []DLQIngestion
	for _, name := range st.work {
		if dlq := st.queues[rabbitnames.For(name).DLQ]; dlq != nil {
			out = append(out, DLQIngestion{Queue: name, Ingested: dlq.Stats.Publish, Known: true, Size: dlq.Messages})
		}
	}
	return out, nil
}

// listQueues is Queues for RabbitMQ: the configured queues and those
// the pattern finds now (one request); the configured ones alone when the
// broker cannot be read, with the error.
func (r *rabbitSource) listQueues(ctx context.Context) ([]Queue, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.timeout)
	defer cancel()
	names := r.names
	var err error
	if r.match != nil {
		var st *rabbitState
		if st, err = r.read(ctx); err == nil {
			names = st.work
		}
	}
	qs := make([]Queue, len(names))
	for i, n := range names {
		qs[i] = Queue{Name: n}
	}
	return qs, err
}

// close does nothing: the requests' connections are the HTTP client's.
func (r *rabbitSource) close() error { return nil }

// ready reads the virtual host from the management API: one small object,
// however many queues it holds.
func (r *rabbitSource) ready(ctx context.Context) error {
	var vhost struct{ Name string }
	return r.get(ctx, "vhosts", "name", &vhost)
}
