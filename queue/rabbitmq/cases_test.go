package rabbitmq_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/bits"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/testing/casetest"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/rabbittest"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/rabbitmq"
)

// The shared RabbitMQ cases (testdata/rabbitmq/cases.json, see its
// README): a delivery and what the handler or the breaker says of it, run
// through Work against a real broker, and where every message is after.
// `make rabbitmq-cases` regenerates the file (-update); without -update
// the test replays every case and compares.
var updateRabbitCases = flag.Bool("update", false, "regenerate testdata/rabbitmq/cases.json from the Go worker")

const rabbitCasesFile = "../../testdata/rabbitmq/cases.json"

const rabbitCasePolicy = `{"max_attempts": 4, "max_elapsed": "1h", "uncertain": {"max_attempts": 2},
 "backoff": {"strategy": "exponential", "base": "10s", "multiplier": 2, "cap": "300s"},
 "jitter": {"mode": "none"}, "retry_after": {"cap": "60s", "on_exceed": "give_up"}}`

type rabbitCaseFile struct {
	Comment       string          `json:"comment"`
	Queue         string          `json:"queue"`
	MaxDeliveries int             `json:"max_deliveries"`
	Policy        json.RawMessage `json:"policy"`
	Cases         []rabbitCase    `json:"cases"`
}

type rabbitCase struct {
	Name     string            `json:"name"`
	Delivery *caseDelivery     `json:"delivery,omitempty"`
	DLQ      []json.RawMessage `json:"dlq,omitempty"`
	Event    rabbitEvent       `json:"event"`
	Expect   json.RawMessage   `json:"expect,omitempty"`
}

type caseDelivery struct {
	Message json.RawMessage `json:"message"`
	// Returns is how often the delivery is returned (nack, requeue) before
	// the worker gets it: the broker's x-delivery-count.
	Returns int `json:"returns,omitempty"`
}

type rabbitEvent struct {
	Type   string     `json:"type"` // handle, replay
	Error  *caseError `json:"error,omitempty"`
	Refuse *struct {
		Reason    string `json:"reason"`
		RetryInMs int64  `json:"retry_in_ms"`
	} `json:"refuse,omitempty"`
	// Deadline: the handler overran the worker's deadline (it blocks,
	// ignoring its ctx, while the worker's caseHandlerTimeout ends the
	// attempt).
	Deadline     bool   `json:"deadline,omitempty"`
	Limit        int    `json:"limit,omitempty"`
	Reason       string `json:"reason,omitempty"`
	KeepAttempts bool   `json:"keep_attempts,omitempty"`
}

// caseHandlerTimeout is the deadline cases' handler timeout, and
// caseDeadlineText the text of the worker's deadline error at it, written
// casetest.DeadlineToken in the file.
const (
	caseHandlerTimeout = 50 * time.Millisecond
	caseDeadlineText   = "handler deadline exceeded after 50ms"
)

// caseError is testdata/queue's handle error.
type caseError = casetest.Error

// caseErr is the error the handler returns for e.
func caseErr(t *testing.T, e *caseError) error {
	return e.Handle(t, func() error {
		return &backstop.Failure{HTTPStatus: e.HTTPStatus, GRPCCode: e.GRPCCode, ErrorKind: e.ErrorKind,
			RetryAfter: e.RetryAfter, Err: errors.New(e.Message)}
	})
}

// spy reports the failure the policy was asked about and its answer; with
// refuse set, its breaker refuses every job.
type spy struct {
	backstop.Decider
	refuse   *policy.Permit
	mu       sync.Mutex
	asked    map[string]any
	decision map[string]any
}

// Outcome records the failure of a failed job and the policy's decision of
// it (a deferral is the decision's dead_letter); with refuse set, the
// breaker refuses the job before it runs, as the policy's outcome of a
// refusal of retry_in_ms with on_open defer says.
func (s *spy) Outcome(ctx context.Context, e policy.JobEvent) (policy.Outcome, error) {
	if e.Event == policy.EventBefore && s.refuse != nil {
		return policy.Outcome{Action: policy.OutcomeDefer, Reason: policy.CircuitOpen, DelayMs: s.refuse.RetryInMs,
			Pause: true, Count: policy.CountRefused}, nil
	}
	o, err := s.Decider.Outcome(ctx, e)
	if e.Event != policy.EventFailure {
		return o, err
	}
	f := e.Failure
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked = map[string]any{"attempt": f.Attempt}
	for k, v := range map[string]any{"http_status": f.HTTPStatus, "grpc_code": f.GRPCCode, "error_kind": f.ErrorKind,
		"retry_after": f.RetryAfter, "prev_delay_ms": f.PrevDelayMs, "retried_downstream": f.RetriedDownstream, "server_declined": f.ServerDeclined} {
		if v != 0 && v != "" && v != int64(0) && v != false {
			s.asked[k] = v
		}
	}
	s.decision = map[string]any{"action": "dead_letter", "reason": o.Reason.String()}
	if o.Action == policy.OutcomeRetry {
		s.decision["action"], s.decision["delay_ms"] = "retry", o.DelayMs
	}
	return o, err
}

func TestRabbitCases(t *testing.T) {
	var file rabbitCaseFile
	if *updateRabbitCases {
		file = rabbitCaseFile{
			Comment: "generated by `make rabbitmq-cases` (queue/rabbitmq/cases_test.go); see README.md",
			Queue:   "q", MaxDeliveries: 5, Policy: json.RawMessage(rabbitCasePolicy), Cases: buildRabbitCases(),
		}
	} else {
		casetest.Read(t, rabbitCasesFile, &file)
	}
	p, err := policy.Parse(file.Policy)
	if err != nil {
		t.Fatal(err)
	}
	broker := rabbittest.Start(t)
	ctx := context.Background()
	b, err := rabbitmq.Open(ctx, broker.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	h := &caseHarness{t: t, b: b, conn: broker.Dial(t), file: &file, decider: backstop.Native(p)}
	casetest.UniqueNames(t, file.Cases, func(c rabbitCase) string { return c.Name })
	for i := range file.Cases {
		c := &file.Cases[i]
		got := h.run(c)
		if *updateRabbitCases {
			c.Expect = got
			continue
		}
		if string(canonical(t, got)) != string(canonical(t, c.Expect)) {
			t.Errorf("case %s:\n got  %s\n want %s", c.Name, canonical(t, got), canonical(t, c.Expect))
		}
	}
	if *updateRabbitCases {
		casetest.Write(t, rabbitCasesFile, file)
		return
	}
	// The early cases again, the worker reaching the delivery more than a
	// second late (a loaded machine): the remainder it re-delays for is a
	// second shorter, and the case must still hold.
	h.late = 1500 * time.Millisecond
	for i := range file.Cases {
		c := &file.Cases[i]
		if !strings.HasPrefix(c.Name, "early/") {
			continue
		}
		if got := h.run(c); string(canonical(t, got)) != string(canonical(t, c.Expect)) {
			t.Errorf("case %s, worker 1.5 s late:\n got  %s\n want %s", c.Name, canonical(t, got), canonical(t, c.Expect))
		}
	}
}

func canonical(t *testing.T, raw json.RawMessage) []byte {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(v) // maps: keys sorted
	return out
}

type caseHarness struct {
	t       *testing.T
	b       *rabbitmq.Broker
	conn    *amqp.Connection
	file    *rabbitCaseFile
	decider backstop.Decider
	// late backdates the case's clock, as if the worker reached the
	// delivery that much after the case started.
	late time.Duration
}

// delayLevels is the hold levels (hold.L0..L10), keyWords the words of a
// delay's routing key (18 bits), maxRouted the longest delay routed (s).
const (
	delayLevels = 11
	keyWords    = 18
	maxRouted   = 1<<delayLevels - 1
)

func levelQueue(n int) string { return "backstop.hold.L" + strconv.Itoa(n) }

// run sets up c, drives its event and returns the normalised expectation.
func (h *caseHarness) run(c *rabbitCase) json.RawMessage {
	t := h.t
	t.Helper()
	ctx := context.Background()
	fail := func(what string, err error) {
		if err != nil {
			t.Fatalf("case %s: %s: %v", c.Name, what, err)
		}
	}
	name := h.file.Queue
	ch, err := h.conn.Channel()
	fail("channel", err)
	defer ch.Close()
	for _, q := range []string{name, name + ".dlq"} {
		_, err := ch.QueueDelete(q, false, false, false)
		fail("delete "+q, err)
	}
	for _, x := range []string{name + ".delay", name + ".due"} {
		fail("delete "+x, ch.ExchangeDelete(x, false, false))
	}
	q := h.b.Queue(name, rabbitmq.WithMaxDeliveries(h.file.MaxDeliveries))
	fail("declare", q.Declare(ctx))
	for n := 0; n < delayLevels; n++ {
		_, err := ch.QueuePurge(levelQueue(n), false)
		fail("purge", err)
	}

	base := time.Now().Add(-h.late).UnixMilli()
	known := map[int64]bool{0: true}
	fail("confirm", ch.Confirm(false))
	publish := func(key string, raw json.RawMessage) amqp.Publishing {
		msg, err := decodeMessage([]byte(casetest.Resolve(string(raw), base, known)))
		fail("message", err)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", key, true, false, msg)
		fail("publish", err)
		if !dc.Wait() {
			t.Fatalf("case %s: publish to %s not confirmed", c.Name, key)
		}
		return msg
	}
	for _, m := range c.DLQ {
		publish(name+".dlq", m)
	}
	// The delivery's own due time: a re-delay for the rest of it keeps it.
	var ownDue string
	if c.Delivery != nil {
		ownDue, _ = publish(name, c.Delivery.Message).Headers[rabbitmq.HeaderDueMs].(string)
		for i := 0; i < c.Delivery.Returns; i++ {
			var d amqp.Delivery
			eventually.True(t, 10*time.Second, "the delivery to return", func() bool {
				var ok bool
				d, ok, err = ch.Get(name, false)
				fail("get", err)
				return ok
			})
			fail("return", d.Nack(false, true))
		}
	}

	var reply map[string]any
	reg := prometheus.NewRegistry()
	switch c.Event.Type {
	case "handle":
		reply = h.handle(c, q, reg, known)
	case "replay":
		n, err := q.Replay(ctx, rabbitmq.ReplayOptions{Limit: c.Event.Limit, Reason: c.Event.Reason, KeepAttempts: c.Event.KeepAttempts})
		if err != nil {
			reply = map[string]any{"refused": true}
		} else {
			reply = map[string]any{"replayed": n}
		}
	default:
		t.Fatalf("case %s: event type %q unknown", c.Name, c.Event.Type)
	}
	end := time.Now().UnixMilli()

	expect := map[string]any{"reply": reply}
	expect["work"] = h.drain(ch, name)
	expect["dlq"] = h.drain(ch, name+".dlq")
	var delayed []any
	for n := 0; n < delayLevels; n++ {
		for _, m := range h.drainDeliveries(ch, levelQueue(n)) {
			entry := map[string]any{"queue": levelQueue(n), "routing_key": m.RoutingKey, "message": encodeMessage(m)}
			if due, _ := m.Headers[rabbitmq.HeaderDueMs].(string); due != "" && due == ownDue &&
				dueKeyFits(m.RoutingKey, levelQueue(n), due, base, end) {
				entry["queue"], entry["routing_key"] = "{due}", "{due}"
			}
			delayed = append(delayed, entry)
		}
	}
	sortMessages(delayed, func(v any) any { return v.(map[string]any)["message"] })
	if delayed == nil {
		delayed = []any{}
	}
	expect["delayed"] = delayed
	expect["counters"] = counters(t, reg)
	out, err := json.Marshal(expect)
	fail("marshal", err)
	text := ""
	if c.Event.Deadline {
		text = caseDeadlineText
	}
	adopted := adoptedID.ReplaceAllString(string(out), "{adopted_id}")
	return json.RawMessage(casetest.Normalise(casetest.Deadline(adopted, text), base, end, known))
}

// adoptedID is the id a worker gives a plain message without message_id
// (random: written {adopted_id} in the cases, before the times are
// normalised, as its digits may look like one).
var adoptedID = regexp.MustCompile(`amqp-[0-9a-f]{32}`)

// handle runs Work on the case's delivery until it is dealt with.
func (h *caseHarness) handle(c *rabbitCase, q *rabbitmq.Queue, reg *prometheus.Registry, known map[int64]bool) map[string]any {
	t := h.t
	s := &spy{Decider: h.decider}
	if r := c.Event.Refuse; r != nil {
		s.refuse = &policy.Permit{Allowed: false, RetryInMs: r.RetryInMs, State: policy.BreakerOpen}
		known[r.RetryInMs] = true
	}
	var ran atomic.Bool
	overrun := make(chan struct{})
	handler := func(ctx context.Context, j queue.Job) error {
		ran.Store(true)
		if c.Event.Deadline {
			<-overrun
			return nil
		}
		if c.Event.Error == nil {
			return nil
		}
		return caseErr(t, c.Event.Error)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		opts := []rabbitmq.WorkOption{rabbitmq.WithPrefetch(1), rabbitmq.WithMetrics(reg, "cases"), rabbitmq.WithoutMover()}
		if c.Event.Deadline {
			opts = append(opts, rabbitmq.WithHandlerTimeout(caseHandlerTimeout))
		}
		done <- q.Work(ctx, s, handler, opts...)
	}()
	defer close(overrun)
	watch := append([]string{q.Name() + ".dlq"}, func() []string {
		var ls []string
		for n := 0; n < delayLevels; n++ {
			ls = append(ls, levelQueue(n))
		}
		return ls
	}()...)
	eventually.True(t, 20*time.Second, "case "+c.Name+": the worker to deal with the delivery", func() bool {
		return ran.Load() || h.anyReady(watch)
	})
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("case %s: Work: %v", c.Name, err)
	}
	reply := map[string]any{"ran": ran.Load()}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.asked != nil {
		reply["failure"] = s.asked
		reply["decision"] = s.decision
		if d, ok := s.decision["delay_ms"].(int64); ok {
			known[d] = true
		}
	}
	return reply
}

// dueKeyFits reports whether key and level are those of a message delayed
// again for the rest of due by a worker that reached it between base and
// end: a delay of s seconds with ceil((due-end)/1000) <= s <=
// ceil((due-base)/1000) (at most maxRouted), level its highest set bit. How late the worker
// was changes the key, so the cases write it "{due}" (see the README).
func dueKeyFits(key, level, due string, base, end int64) bool {
	d, err := strconv.ParseInt(due, 10, 64)
	words := strings.Split(key, ".")
	if err != nil || len(words) != keyWords {
		return false
	}
	var s int64
	for _, w := range words {
		if w != "0" && w != "1" {
			return false
		}
		s = s<<1 | int64(w[0]-'0')
	}
	restSecs := func(at int64) int64 { return min(int64(math.Ceil(float64(d-at)/1000)), maxRouted) }
	return s > 0 && restSecs(end) <= s && s <= restSecs(base) && level == levelQueue(bits.Len64(uint64(s))-1)
}

// anyReady reports whether one of queues holds a message.
func (h *caseHarness) anyReady(queues []string) bool {
	ch, err := h.conn.Channel()
	if err != nil {
		h.t.Fatal(err)
	}
	defer ch.Close()
	for _, name := range queues {
		st, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		if err != nil {
			h.t.Fatalf("passive declare %s: %v", name, err)
		}
		if st.Messages > 0 {
			return true
		}
	}
	return false
}

func (h *caseHarness) drainDeliveries(ch *amqp.Channel, name string) []amqp.Delivery {
	var ds []amqp.Delivery
	for {
		d, ok, err := ch.Get(name, true)
		if err != nil {
			h.t.Fatalf("drain %s: %v", name, err)
		}
		if !ok {
			return ds
		}
		ds = append(ds, d)
	}
}

func (h *caseHarness) drain(ch *amqp.Channel, name string) []any {
	out := []any{}
	for _, d := range h.drainDeliveries(ch, name) {
		out = append(out, encodeMessage(d))
	}
	sortMessages(out, func(v any) any { return v })
	return out
}

// sortMessages sorts by message_id, then by the JSON.
func sortMessages(list []any, msg func(any) any) {
	key := func(i int) string {
		m := msg(list[i]).(map[string]any)
		id, _ := m["message_id"].(string)
		j, _ := json.Marshal(list[i])
		return id + "\x00" + string(j)
	}
	sort.SliceStable(list, func(i, j int) bool { return key(i) < key(j) })
}

// counters lists the registry's counter samples that are not 0, and the
// _count and _sum of its histograms but durations.
func counters(t *testing.T, reg *prometheus.Registry) map[string]any {
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]any{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := sampleLabels(m)
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				if v := m.GetCounter().GetValue(); v != 0 {
					out[mf.GetName()+labels] = v
				}
			case dto.MetricType_HISTOGRAM:
				if strings.HasSuffix(mf.GetName(), "_seconds") || m.GetHistogram().GetSampleCount() == 0 {
					continue
				}
				out[mf.GetName()+"_count"+labels] = m.GetHistogram().GetSampleCount()
				out[mf.GetName()+"_sum"+labels] = m.GetHistogram().GetSampleSum()
			}
		}
	}
	return out
}

func sampleLabels(m *dto.Metric) string {
	var parts []string
	for _, l := range m.GetLabel() {
		parts = append(parts, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return ""
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// A message in the cases' JSON (see the README): properties by their
// snake_case names, typed header values, a UTF-8 body or body_base64.
type caseMessage struct {
	MessageID       string `json:"message_id,omitempty"`
	ContentType     string `json:"content_type,omitempty"`
	ContentEncoding string `json:"content_encoding,omitempty"`
	DeliveryMode    uint8  `json:"delivery_mode,omitempty"`
	Priority        uint8  `json:"priority,omitempty"`
	CorrelationID   string `json:"correlation_id,omitempty"`
	Type            string `json:"type,omitempty"`
	AppID           string `json:"app_id,omitempty"`
	// Timestamp (unix seconds) is read, never written: a publish's own
	// would not normalise.
	Timestamp  int64          `json:"timestamp,omitempty"`
	Headers    map[string]any `json:"headers,omitempty"`
	Body       *string        `json:"body,omitempty"`
	BodyBase64 string         `json:"body_base64,omitempty"`
}

func decodeMessage(raw []byte) (amqp.Publishing, error) {
	var m caseMessage
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.UseNumber()
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return amqp.Publishing{}, err
	}
	p := amqp.Publishing{MessageId: m.MessageID, ContentType: m.ContentType, ContentEncoding: m.ContentEncoding,
		DeliveryMode: m.DeliveryMode, Priority: m.Priority, CorrelationId: m.CorrelationID, Type: m.Type, AppId: m.AppID}
	if m.Timestamp != 0 {
		p.Timestamp = time.Unix(m.Timestamp, 0)
	}
	if m.Headers != nil {
		t, err := decodeValue(map[string]any{"table": m.Headers})
		if err != nil {
			return p, err
		}
		p.Headers = t.(amqp.Table)
	}
	switch {
	case m.Body != nil:
		p.Body = []byte(*m.Body)
	case m.BodyBase64 != "":
		b, err := base64.StdEncoding.DecodeString(m.BodyBase64)
		if err != nil {
			return p, fmt.Errorf("body_base64: %w", err)
		}
		p.Body = b
	}
	return p, nil
}

// decodeValue turns a typed JSON header value into its AMQP value.
func decodeValue(v any) (any, error) {
	switch v := v.(type) {
	case nil:
		return nil, nil
	case string, bool:
		return v, nil
	case map[string]any:
		if len(v) != 1 {
			return nil, fmt.Errorf("header value %v: want one type key", v)
		}
		for k, x := range v {
			switch k {
			case "int":
				s, _ := x.(string)
				n, err := strconv.ParseInt(s, 10, 64)
				return n, err
			case "float":
				n, ok := x.(json.Number)
				if !ok {
					return nil, fmt.Errorf("float %v: not a number", x)
				}
				return n.Float64()
			case "bytes":
				s, _ := x.(string)
				return base64.StdEncoding.DecodeString(s)
			case "timestamp":
				n, _ := x.(json.Number)
				sec, err := n.Int64()
				return time.Unix(sec, 0), err
			case "table":
				m, _ := x.(map[string]any)
				t := amqp.Table{}
				for hk, hv := range m {
					d, err := decodeValue(hv)
					if err != nil {
						return nil, fmt.Errorf("%s: %w", hk, err)
					}
					t[hk] = d
				}
				return t, nil
			case "array":
				xs, _ := x.([]any)
				out := make([]any, len(xs))
				for i, e := range xs {
					d, err := decodeValue(e)
					if err != nil {
						return nil, err
					}
					out[i] = d
				}
				return out, nil
			}
			return nil, fmt.Errorf("header value type %q unknown", k)
		}
	}
	return nil, fmt.Errorf("header value %v (%T): write numbers typed, {\"int\": \"3\"}", v, v)
}

func encodeMessage(d amqp.Delivery) map[string]any {
	m := map[string]any{}
	for k, v := range map[string]string{"message_id": d.MessageId, "content_type": d.ContentType,
		"content_encoding": d.ContentEncoding, "correlation_id": d.CorrelationId, "type": d.Type, "app_id": d.AppId} {
		if v != "" {
			m[k] = v
		}
	}
	if d.DeliveryMode != 0 {
		m["delivery_mode"] = d.DeliveryMode
	}
	if d.Priority != 0 {
		m["priority"] = d.Priority
	}
	h := map[string]any{}
	for k, v := range d.Headers {
		if k == "x-delivery-count" {
			continue // set by the quorum queue on every delivery, the drain's own included
		}
		h[k] = encodeValue(v)
	}
	if len(h) > 0 {
		m["headers"] = h
	}
	if utf8.Valid(d.Body) {
		m["body"] = string(d.Body)
	} else {
		m["body_base64"] = base64.StdEncoding.EncodeToString(d.Body)
	}
	return m
}

func encodeValue(v any) any {
	switch v := v.(type) {
	case nil, string, bool:
		return v
	case int8, int16, int32, int64, uint8, uint16, uint32, int:
		return map[string]any{"int": fmt.Sprint(v)}
	case float32:
		return map[string]any{"float": float64(v)}
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return map[string]any{"float": fmt.Sprint(v)}
		}
		return map[string]any{"float": v}
	case []byte:
		return map[string]any{"bytes": base64.StdEncoding.EncodeToString(v)}
	case time.Time:
		return map[string]any{"timestamp": v.Unix()}
	case amqp.Table:
		t := map[string]any{}
		for k, x := range v {
			t[k] = encodeValue(x)
		}
		return map[string]any{"table": t}
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = encodeValue(x)
		}
		return map[string]any{"array": out}
	case amqp.Decimal:
		return map[string]any{"decimal": fmt.Sprintf("%d/%d", v.Value, v.Scale)}
	}
	return map[string]any{"unknown": fmt.Sprintf("%T", v)}
}
