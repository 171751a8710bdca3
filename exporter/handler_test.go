package exporter

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
)

// countingCollector counts its Collect calls: how many times a registry
// was gathered.
type countingCollector struct {
	calls atomic.Int64
	desc  *prometheus.Desc
}

func newCountingCollector() *countingCollector {
	return &countingCollector{desc: prometheus.NewDesc("test_gathered", "A test gauge.", nil, nil)}
}

func (c *countingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c *countingCollector) Collect(ch chan<- prometheus.Metric) {
	c.calls.Add(1)
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, 1)
}

const (
	acceptText = "text/plain;version=0.0.4;q=1"
	// What Prometheus 2 and 3 send by default.
	acceptOM = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)

// get requests url with the Accept and Accept-Encoding headers given and
// returns the response and its body, decompressed.
func get(t *testing.T, url, accept string, gz bool) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	must(t, err)
	req.Header.Set("Accept", accept)
	if gz {
		req.Header.Set("Accept-Encoding", "gzip")
	} else {
		req.Header.Set("Accept-Encoding", "identity")
	}
	resp, err := http.DefaultTransport.RoundTrip(req) // no transparent gunzip
	must(t, err)
	defer resp.Body.Close()
	var r io.Reader = resp.Body
	if gz {
		if resp.Header.Get("Content-Encoding") != "gzip" {
			t.Fatalf("asked for gzip, got Content-Encoding %q", resp.Header.Get("Content-Encoding"))
		}
		zr, err := gzip.NewReader(resp.Body)
		must(t, err)
		r = zr
	} else if ce := resp.Header.Get("Content-Encoding"); ce != "" {
		t.Fatalf("asked for identity, got Content-Encoding %q", ce)
	}
	body, err := io.ReadAll(r)
	must(t, err)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, body)
	}
	return resp, body
}

// TestHandlerSharesOneBody holds the first request's collection in Redis
// until eleven more requests, in two formats with and without gzip, wait
// for it: Redis sees one pipeline, the other collectors are gathered once,
// each of the four kinds of body is encoded once, and every request of a
// kind gets the same bytes. The twelve scrapes hold one collection and
// four bodies, not twelve of each.
func TestHandlerSharesOneBody(t *testing.T) {
	rdb := redistest.Start(t).Client()
	fill(t, rdb, "q", 3, 10, 2)
	hook := newBlockHook()
	rdb.AddHook(hook)
	t.Cleanup(hook.Release)
	c, _ := newTestCollector(t, rdb, WithClientPipelines(), WithQueues(QueueFor("q0"), QueueFor("q1"), QueueFor("q2")))
	counting := newCountingCollector()
	extra := prometheus.NewRegistry()
	extra.MustRegister(counting)
	h := c.Handler(extra).(*handler)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	type kind struct {
		accept string
		gz     bool
	}
	kinds := []kind{{acceptText, false}, {acceptText, true}, {acceptOM, false}, {acceptOM, true}}
	bodies := make([][]byte, 12)
	types := make([]string, 12)
	var wg sync.WaitGroup
	request := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := kinds[i%len(kinds)]
			resp, b := get(t, srv.URL, k.accept, k.gz)
			bodies[i], types[i] = b, resp.Header.Get("Content-Type")
		}()
	}
	request(0)
	<-hook.entered // the first request's collection is in Redis
	for i := 1; i < 12; i++ {
		request(i)
	}
	deadline := time.Now().Add(10 * time.Second)
	for h.waiting() < 11 {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests wait, want 11", h.waiting())
		}
		runtime.Gosched()
	}
	hook.Release()
	wg.Wait()

	if n := len(hook.entered); n != 0 {
		t.Errorf("%d more pipelines ran, want none", n)
	}
	if n := counting.calls.Load(); n != 1 {
		t.Errorf("the other collectors were gathered %d times, want once", n)
	}
	if h.stats.encodes != 4 {
		t.Errorf("%d bodies encoded, want 4: one per format and encoding", h.stats.encodes)
	}
	for i := range bodies {
		k := kinds[i%len(kinds)]
		if !bytes.Equal(bodies[i], bodies[i%len(kinds)]) {
			t.Errorf("request %d got another body than request %d", i, i%len(kinds))
		}
		wantType := "text/plain; version=0.0.4"
		if k.accept == acceptOM {
			wantType = "application/openmetrics-text; version=1.0.0"
		}
		if !strings.HasPrefix(types[i], wantType) {
			t.Errorf("request %d: Content-Type %q, want %q", i, types[i], wantType)
		}
	}
	// Gzipped or not, a format's body is the same text.
	if !bytes.Equal(bodies[0], bodies[1]) || !bytes.Equal(bodies[2], bodies[3]) {
		t.Error("the gzipped body differs from the plain one")
	}
	if !bytes.Contains(bodies[0], []byte("backstop_up 1\n")) || !bytes.Contains(bodies[0], []byte("test_gathered 1\n")) {
		t.Errorf("text body:\n%s", bodies[0])
	}
	if !bytes.HasSuffix(bodies[2], []byte("# EOF\n")) {
		t.Errorf("OpenMetrics body does not end with # EOF")
	}

	// A request after that collection ended reads Redis again.
	get(t, srv.URL, acceptText, true)
	if n := len(hook.entered); n != 1 {
		t.Errorf("%d pipelines after the shared collection, want 1", n)
	}
	if n := counting.calls.Load(); n != 2 {
		t.Errorf("other collectors gathered %d times, want 2", n)
	}
}

// TestHandlerFormats negotiates the format: OpenMetrics for Prometheus's
// Accept header (TestEncodeMatchesExpfmt proves its bytes), the text
// format for a plain client and for one that asks for protobuf (which
// backstop does not offer; the text format parses); and answers HEAD.
func TestHandlerFormats(t *testing.T) {
	rdb := redistest.Start(t).Client()
	prepareOrders(t, rdb)
	c, _ := newTestCollector(t, rdb, WithQueues(QueueFor("orders")))
	srv := httptest.NewServer(c.Handler(nil))
	t.Cleanup(srv.Close)

	for accept, om := range map[string]bool{acceptOM: true, acceptText: false, "": false,
		"application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited": false,
	} {
		resp, body := get(t, srv.URL, accept, false)
		ct := resp.Header.Get("Content-Type")
		if om {
			if !strings.HasPrefix(ct, "application/openmetrics-text; version=1.0.0") || !bytes.HasSuffix(body, []byte("\n# EOF\n")) ||
				!bytes.Contains(body, []byte("# TYPE backstop_attempts counter\nbackstop_attempts_total{job_type=\"\",outcome=")) {
				t.Errorf("Accept %q: Content-Type %q, body:\n%s", accept, ct, body)
			}
			continue
		}
		if !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
			t.Errorf("Accept %q: Content-Type %q", accept, ct)
		}
		p := expfmt.NewTextParser(model.LegacyValidation)
		mfs, err := p.TextToMetricFamilies(bytes.NewReader(body))
		if err != nil || len(mfs) < 20 {
			t.Errorf("Accept %q: %d families, %v\n%s", accept, len(mfs), err, body)
		}
		if resp.Header.Get("Content-Length") != strconv.Itoa(len(body)) {
			t.Errorf("Accept %q: Content-Length %q for %d bytes", accept, resp.Header.Get("Content-Length"), len(body))
		}
	}
	req, _ := http.NewRequest("HEAD", srv.URL, nil)
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") == "" {
		t.Errorf("HEAD: %s %v", resp.Status, resp.Header)
	}
}

// replay is a collector of fixed samples, to encode them through
// client_golang's registry and expfmt.
type replay struct{ ss *samples }

func (replay) Describe(chan<- *prometheus.Desc) {} // unchecked
func (r replay) Collect(ch chan<- prometheus.Metric) {
	r.ss.all(func(s *sample) { ch <- r.ss.metric(s) })
}

// expfmtBody encodes ss and the other registry's metrics as promhttp does.
func expfmtBody(t *testing.T, ss *samples, others *prometheus.Registry, format expfmt.Format) []byte {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(replay{ss})
	fams, err := prometheus.Gatherers{reg, others}.Gather()
	must(t, err)
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, format)
	for _, f := range fams {
		must(t, enc.Encode(f))
	}
	must(t, enc.(expfmt.Closer).Close())
	return buf.Bytes()
}

func encodeBody(t *testing.T, ss *samples, others *prometheus.Registry, om bool) []byte {
	t.Helper()
	fams, err := others.Gather()
	must(t, err)
	var buf bytes.Buffer
	w := bufio.NewWriter(&buf)
	left, err := encode(w, ss, fams, om)
	must(t, err)
	must(t, w.Flush())
	if len(left) > 0 {
		t.Errorf("left out %v", left)
	}
	return buf.Bytes()
}

// TestEncodeMatchesExpfmt encodes samples with the handler's encoder and
// through client_golang's registry and expfmt: the same bytes, in both
// formats, for a real scrape and for label values and numbers that need
// escaping or special spelling, merged with another collector's families
// whose names sort between backstop's.
func TestEncodeMatchesExpfmt(t *testing.T) {
	rdb := redistest.Start(t).Client()
	prepareOrders(t, rdb)
	prepareLegacy(t, rdb)
	prepareLagless(t, rdb)
	qs, err := LoadQueuesConfig("testdata/queues.yaml")
	must(t, err)
	c, _ := newTestCollector(t, rdb, WithQueues(qs...))
	real := c.scrape()

	s := &sink{kinds: map[string]error{}}
	for i, v := range []float64{0, math.Copysign(0, -1), 1, -1, 0.5, 1e21, 123456789, 1e-7, math.NaN(), math.Inf(1), math.Inf(-1), 42, 999999, 1e6, -999999, -1e6, 1e15} {
		name := []string{"a\"b", `back\slash`, "new\nline", "ünï", "", "plain", "x", "y", "z", "zz", "zzz", "ä", "n1", "n2", "n3", "n4", "n5"}[i]
		s.gauge(delayedSizeDesc, v, name)
		s.counter(dlqIngestedDesc, v, name)
		s.counter(retriesDesc, v, name, "r\"\\\n")
	}
	s.histogram(jobAttemptsDesc, attemptBuckets, make([]uint64, len(attemptBuckets)), 3, 7.5, "q", "success")
	s.histogram(deliveriesDesc, deliveryBuckets, []uint64{1, 2, 3, 4, 5}, 6, 0, "q", "g")
	s.gauge(upDesc, 1)

	others := prometheus.NewRegistry()
	others.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "backstop_dlq_zzz_total", Help: `Sorts "between" backstop's.`}, func() float64 { return 3 }))
	others.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "aaa", Help: "First\\."}, func() float64 { return 2.5 }))
	others.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "zzz", Help: "Last."}, func() float64 { return -1 }))

	for name, ss := range map[string]*samples{"real scrape": real, "escapes": &s.samples} {
		for _, om := range []bool{false, true} {
			format := expfmt.NewFormat(expfmt.TypeTextPlain)
			if om {
				format = expfmt.NewFormat(expfmt.TypeOpenMetrics)
			}
			want := expfmtBody(t, ss, others, format)
			got := encodeBody(t, ss, others, om)
			if !bytes.Equal(got, want) {
				t.Errorf("%s, OpenMetrics %v: the encoder differs from expfmt:\n%s", name, om, lineDiff(got, want))
			}
		}
	}
}

// lineDiff shows the first line where got and want differ.
func lineDiff(got, want []byte) string {
	g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := range min(len(g), len(w)) {
		if g[i] != w[i] {
			return fmt.Sprintf("line %d:\n got  %q\n want %q", i+1, g[i], w[i])
		}
	}
	return fmt.Sprintf("lengths differ: %d vs %d lines", len(g), len(w))
}

func TestAcceptsGzip(t *testing.T) {
	for header, want := range map[string]bool{
		"gzip": true, "deflate, gzip;q=1.0, *;q=0.5": true, "GZIP": true, "gzip;q=0": false,
		"gzip; q=0.000": false, "identity": false, "": false, "x-gzip2": false,
	} {
		if got := acceptsGzip(header); got != want {
			t.Errorf("acceptsGzip(%q) = %v", header, got)
		}
	}
}
