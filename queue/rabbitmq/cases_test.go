package rabbitmq_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop/internal/eventually"
	"github.com/backstop-dev/backstop/internal/rabbittest"
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
	Limit        int    `json:"limit,omitempty"`
	Reason       string `json:"reason,omitempty"`
	KeepAttempts bool   `json:"keep_attempts,omitempty"`
}

// caseError is testdata/queue's handle error.
type caseError struct {
	Message    string `json:"message"`
	HTTPStatus int    `json:"http_status,omitempty"`
	GRPCCode   int    `json:"grpc_code,omitempty"`
	ErrorKind  string `json:"error_kind,omitempty"`
	RetryAfter string `json:"retry_after,omitempty"`
	Native     string `json:"native,omitempty"`
}

func (e *caseError) err(t *testing.T) error {
	if e.Native != "" {
		return &nativeErr{msg: e.Message, err: native(t, e.Native)}
	}
	return &queue.Failure{HTTPStatus: e.HTTPStatus, GRPCCode: e.GRPCCode, ErrorKind: e.ErrorKind,
		RetryAfter: e.RetryAfter, Err: errors.New(e.Message)}
}

// nativeErr is a language error of a kind with the case's text.
type nativeErr struct {
	msg string
	err error
}

func (e *nativeErr) Error() string { return e.msg }
func (e *nativeErr) Unwrap() error { return e.err }

// native makes Go's own error of a kind, as the standard library does.
func native(t *testing.T, kind string) error {
	switch kind {
	case "connection_refused":
		return &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	case "timeout":
		return context.DeadlineExceeded
	}
	t.Fatalf("native error of kind %q: none made here", kind)
	return nil
}

// spy reports the failure the policy was asked about and its answer; with
// refuse set, its breaker refuses every job.
type spy struct {
	d        queue.Decider
	refuse   *policy.Permit
	mu       sync.Mutex
	asked    map[string]any
	decision map[string]any
}

func (s *spy) Decide(ctx context.Context, f policy.Failure) (policy.Decision, error) {
	d, err := s.d.Decide(ctx, f)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked = map[string]any{"attempt": f.Attempt}
	for k, v := range map[string]any{"http_status": f.HTTPStatus, "grpc_code": f.GRPCCode, "error_kind": f.ErrorKind,
		"retry_after": f.RetryAfter, "prev_delay_ms": f.PrevDelayMs} {
		if v != 0 && v != "" && v != int64(0) {
			s.asked[k] = v
		}
	}
	s.decision = map[string]any{"action": d.Action.String(), "reason": d.Reason.String()}
	if d.Action == policy.Retry {
		s.decision["delay_ms"] = d.DelayMs
	}
	return d, err
}

func (s *spy) Acquire(_ context.Context, _ int64) (policy.Permit, error) {
	if s.refuse != nil {
		return *s.refuse, nil
	}
	return policy.Permit{Allowed: true}, nil
}

func TestRabbitCases(t *testing.T) {
	var file rabbitCaseFile
	if *updateRabbitCases {
		file = rabbitCaseFile{
			Comment: "generated by `make rabbitmq-cases` (queue/rabbitmq/cases_test.go); see README.md",
			Queue:   "q", MaxDeliveries: 5, Policy: json.RawMessage(rabbitCasePolicy), Cases: buildRabbitCases(),
		}
	} else {
		data, err := os.ReadFile(rabbitCasesFile)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &file); err != nil {
			t.Fatal(err)
		}
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
	conn, err := amqp.Dial(broker.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	h := &caseHarness{t: t, b: b, conn: conn, file: &file, decider: queue.Native(p)}
	seen := map[string]bool{}
	for i := range file.Cases {
		c := &file.Cases[i]
		if seen[c.Name] {
			t.Fatalf("case %q: name given twice", c.Name)
		}
		seen[c.Name] = true
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
		out, err := json.MarshalIndent(file, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(rabbitCasesFile, append(out, '\n'), 0o644); err != nil {
			t.Fatal(err)
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
	decider queue.Decider
}

const delayLevels = 18

func levelQueue(n int) string { return "backstop.delay.L" + strconv.Itoa(n) }

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

	base := time.Now().UnixMilli()
	known := map[int64]bool{0: true}
	fail("confirm", ch.Confirm(false))
	publish := func(key string, raw json.RawMessage) {
		msg, err := decodeMessage([]byte(resolve(string(raw), base, known)))
		fail("message", err)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", key, true, false, msg)
		fail("publish", err)
		if !dc.Wait() {
			t.Fatalf("case %s: publish to %s not confirmed", c.Name, key)
		}
	}
	for _, m := range c.DLQ {
		publish(name+".dlq", m)
	}
	if c.Delivery != nil {
		publish(name, c.Delivery.Message)
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
			delayed = append(delayed, map[string]any{"queue": levelQueue(n), "routing_key": m.RoutingKey, "message": encodeMessage(m)})
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
	return json.RawMessage(normalise(string(out), base, end, known))
}

// handle runs Work on the case's delivery until it is dealt with.
func (h *caseHarness) handle(c *rabbitCase, q *rabbitmq.Queue, reg *prometheus.Registry, known map[int64]bool) map[string]any {
	t := h.t
	s := &spy{d: h.decider}
	if r := c.Event.Refuse; r != nil {
		s.refuse = &policy.Permit{Allowed: false, RetryInMs: r.RetryInMs, State: policy.BreakerOpen}
		known[r.RetryInMs] = true
	}
	var ran atomic.Bool
	handler := func(ctx context.Context, j queue.Job) error {
		ran.Store(true)
		if c.Event.Error == nil {
			return nil
		}
		return c.Event.Error.err(t)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- q.Work(ctx, s, handler, rabbitmq.WithPrefetch(1), rabbitmq.WithMetrics(reg, "cases"))
	}()
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

var nowToken = regexp.MustCompile(`\{now([+-][0-9]+)?\}`)

// resolve writes each "{now}", "{now+N}" or "{now-N}" token as base+N and
// records N as a known offset.
func resolve(s string, base int64, known map[int64]bool) string {
	return nowToken.ReplaceAllStringFunc(s, func(tok string) string {
		var off int64
		if m := nowToken.FindStringSubmatch(tok); m[1] != "" {
			off, _ = strconv.ParseInt(m[1], 10, 64)
		}
		known[off] = true
		return strconv.FormatInt(base+off, 10)
	})
}

var msNumber = regexp.MustCompile(`\b[0-9]{13}\b`)

// normalise writes each 13-digit number v as {now+d} for the smallest
// known offset d with base <= v-d <= end.
func normalise(s string, base, end int64, known map[int64]bool) string {
	offs := make([]int64, 0, len(known))
	for d := range known {
		offs = append(offs, d)
	}
	sort.Slice(offs, func(i, j int) bool { return offs[i] < offs[j] })
	return msNumber.ReplaceAllStringFunc(s, func(num string) string {
		v, _ := strconv.ParseInt(num, 10, 64)
		for _, d := range offs {
			if base <= v-d && v-d <= end {
				switch {
				case d == 0:
					return "{now}"
				case d > 0:
					return "{now+" + strconv.FormatInt(d, 10) + "}"
				default:
					return "{now" + strconv.FormatInt(d, 10) + "}"
				}
			}
		}
		return num
	})
}

// A message in the cases' JSON (see the README): properties by their
// snake_case names, typed header values, a UTF-8 body or body_base64.
type caseMessage struct {
	MessageID       string         `json:"message_id,omitempty"`
	ContentType     string         `json:"content_type,omitempty"`
	ContentEncoding string         `json:"content_encoding,omitempty"`
	DeliveryMode    uint8          `json:"delivery_mode,omitempty"`
	Priority        uint8          `json:"priority,omitempty"`
	CorrelationID   string         `json:"correlation_id,omitempty"`
	Type            string         `json:"type,omitempty"`
	AppID           string         `json:"app_id,omitempty"`
	Headers         map[string]any `json:"headers,omitempty"`
	Body            *string        `json:"body,omitempty"`
	BodyBase64      string         `json:"body_base64,omitempty"`
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
