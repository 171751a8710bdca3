package exporter

import (
	"bufio"
	"bytes"
	"github.com/klauspost/compress/gzip"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// formats are the formats the handler offers, in order of preference:
// OpenMetrics (what Prometheus asks for first) and the text format. Not
// protobuf: a client that asks for it accepts text too (Prometheus
// always does), and backstop has no native histogram to send.
var formats = []expfmt.Format{expfmt.FmtOpenMetrics_1_0_0, expfmt.FmtOpenMetrics_0_0_1, expfmt.FmtText, expfmt.FmtText_1_0_0}

// maxInFlight bounds the requests the handler serves at once; more get
// 503, as promhttp's MaxRequestsInFlight does. Requests that wait for a
// shared response cost a goroutine and a connection each, not a body.
const maxInFlight = 64

// Handler returns the http.Handler of /metrics: it serves c's metrics
// (build info included) and extra's (nil for none: the Go runtime's and
// the process's collectors, say) in OpenMetrics or the text format, as
// the Accept header asks, gzipped when Accept-Encoding allows it.
//
// Requests that arrive while a collection runs wait for it and share it,
// and all that want the same format and encoding share one encoded body:
// twelve concurrent scrapes cost one collection, one encoding and one copy
// of the body in memory, not twelve. A request that arrives once the
// collection is done starts the next one: nothing is cached.
//
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(collectors.NewGoCollector())
//	http.Handle("/metrics", c.Handler(reg))
//
// # Notes
//
// Do not register c in extra: its families would be left out, as
// duplicates (and logged). An error of extra's Gather is logged and what
// it gathered is served, as promhttp.ContinueOnError does.
func (c *Collector) Handler(extra prometheus.Gatherer) http.Handler {
	build := prometheus.NewRegistry()
	build.MustRegister(c.build)
	g := prometheus.Gatherers{build}
	if extra != nil {
		g = append(g, extra)
	}
	return &handler{c: c, extra: g, slots: make(chan struct{}, maxInFlight), sizes: map[bodyKey]int{}}
}

type handler struct {
	c     *Collector
	extra prometheus.Gatherer
	slots chan struct{} // one per request in flight

	mu    sync.Mutex
	cur   *response             // the response whose collection runs; nil when none does
	sizes map[bodyKey]int       // the last body's size of each kind: the next one's buffer
	stats struct{ encodes int } // for tests
}

// response is what the requests of one collection share.
type response struct {
	collected chan struct{} // closed once samples and families are set
	samples   *samples
	families  []*dto.MetricFamily
	waiters   int // requests that joined the collection: for tests

	mu     sync.Mutex
	bodies map[bodyKey]*body
}

// bodyKey is what one body is for: a negotiated format (with its
// escaping) and whether it is gzipped.
type bodyKey struct {
	format expfmt.Format
	gzip   bool
}

type body struct {
	once sync.Once
	b    []byte
	err  error
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	select {
	case h.slots <- struct{}{}:
		defer func() { <-h.slots }()
	default:
		http.Error(w, "Limit of concurrent requests reached ("+strconv.Itoa(maxInFlight)+"), try again later.", http.StatusServiceUnavailable)
		return
	}
	key := bodyKey{format: expfmt.NegotiateAccept(r.Header, formats...), gzip: acceptsGzip(r.Header.Get("Accept-Encoding"))}
	resp := h.join()
	b, err := resp.body(key, h.encode)
	if err != nil {
		h.c.cfg.log.Error("encoding metrics failed", "format", key.format, "err", err)
		http.Error(w, "An error has occurred while serving metrics:\n\n"+err.Error(), http.StatusInternalServerError)
		return
	}
	header := w.Header()
	header.Set("Content-Type", string(key.format))
	header.Add("Vary", "Accept-Encoding")
	if key.gzip {
		header.Set("Content-Encoding", "gzip")
	}
	header.Set("Content-Length", strconv.Itoa(len(b)))
	if r.Method != http.MethodHead {
		_, _ = w.Write(b)
	}
}

// join returns the response of the collection running, or runs one.
func (h *handler) join() *response {
	h.mu.Lock()
	if resp := h.cur; resp != nil {
		resp.waiters++
		h.mu.Unlock()
		<-resp.collected
		return resp
	}
	resp := &response{collected: make(chan struct{}), bodies: map[bodyKey]*body{}}
	h.cur = resp
	h.mu.Unlock()

	defer func() {
		h.mu.Lock()
		h.cur = nil
		h.mu.Unlock()
		close(resp.collected)
	}()
	resp.samples = h.c.flight.do(h.c.scrape) // shared with Collect calls too
	fams, err := h.extra.Gather()
	if err != nil {
		h.c.cfg.log.Error("collector failed", "err", err)
	}
	resp.families = fams
	return resp
}

// waiting returns how many requests wait for the running collection.
func (h *handler) waiting() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur == nil {
		return 0
	}
	return h.cur.waiters
}

// body returns the body of key, encoding it if no request did yet.
func (r *response) body(key bodyKey, encode func(*response, bodyKey) ([]byte, error)) ([]byte, error) {
	r.mu.Lock()
	b := r.bodies[key]
	if b == nil {
		b = &body{}
		r.bodies[key] = b
	}
	r.mu.Unlock()
	b.once.Do(func() { b.b, b.err = encode(r, key) })
	return b.b, b.err
}

// encode writes one body: straight into the gzip stream when gzipped, so
// the text is never held whole.
func (h *handler) encode(r *response, key bodyKey) ([]byte, error) {
	h.mu.Lock()
	h.stats.encodes++
	hint := h.sizes[key]
	h.mu.Unlock()
	var buf bytes.Buffer
	buf.Grow(hint + hint/8 + 512) // no doubling, whose old and new buffers would both be live
	var bw *bufio.Writer
	var gz *gzip.Writer
	if key.gzip {
		gz, _ = gzip.NewWriterLevel(&buf, gzip.BestSpeed) // BestSpeed: a third of the default level's CPU, 9% more bytes
		bw = bufio.NewWriterSize(gz, 64<<10)
	} else {
		bw = bufio.NewWriterSize(&buf, 64<<10)
	}
	left, err := encode(bw, r.samples, r.families, key.format.FormatType() == expfmt.TypeOpenMetrics)
	if err == nil {
		err = bw.Flush()
	}
	if err == nil && gz != nil {
		err = gz.Close()
	}
	if err != nil {
		return nil, err
	}
	if len(left) > 0 { // every scrape, until fixed: a programming error
		h.c.cfg.log.Error("collected metrics named like the exporter's left out", "names", strings.Join(left, ","))
	}
	h.mu.Lock()
	h.sizes[key] = buf.Len()
	h.mu.Unlock()
	return buf.Bytes(), nil
}

// acceptsGzip reads an Accept-Encoding header: gzip, unless given q=0.
func acceptsGzip(header string) bool {
	for _, part := range strings.Split(header, ",") {
		coding, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(coding), "gzip") {
			q := strings.ReplaceAll(params, " ", "")
			return q != "q=0" && q != "q=0.0" && q != "q=0.00" && q != "q=0.000"
		}
	}
	return false
}
