package console

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/backstop-dev/backstop/exporter"
)

// The overview's retry rate and DLQ ingestion over the last hour without a
// Prometheus: the console samples the exporter's readers
// (exporter.Collector.Totals, what backstop_retries_total and
// backstop_dlq_ingested_total report) every interval into a ring per
// queue, of a fixed size that covers an hour. A page load reads the rings,
// never the broker; the memory is the rings', whatever the traffic and
// however long the console runs.

// historyWindow is how far back the overview looks.
const historyWindow = time.Hour

// Sample intervals WithExporter takes. The longest leaves two samples in
// any hour, read at any time: a figure needs two (at 31m, an hour read
// just before a sample holds one, and at 1h the overview never had a
// figure).
const (
	minSampleInterval = time.Second
	maxSampleInterval = historyWindow / 2
)

// point is one sample of a queue's cumulative counts.
type point struct {
	at                  time.Time
	retries, ingested   int64
	retriesOK, ingestOK bool
	bound               bool // retries is an upper bound (RabbitMQ: what entered the delay)
}

// ring holds a queue's last len(buf) points, the oldest overwritten.
type ring struct {
	buf   []point
	start int // the oldest point's index
	n     int
}

func newRing(size int) *ring { return &ring{buf: make([]point, size)} }

// push adds p, dropping the oldest point when the ring is full.
func (r *ring) push(p point) {
	if r.n < len(r.buf) {
		r.buf[(r.start+r.n)%len(r.buf)] = p
		r.n++
		return
	}
	r.buf[r.start] = p
	r.start = (r.start + 1) % len(r.buf)
}

// at returns the i-th point, oldest first.
func (r *ring) at(i int) point { return r.buf[(r.start+i)%len(r.buf)] }

// rates are a queue's figures over the points of the window.
type rates struct {
	Since             time.Time     // the window's first point; zero: no points
	Span              time.Duration // from the first point to the last
	Retries           float64       // retries per second over Span
	Ingested          int64         // dead letters added over Span
	RetriesOK, IngOK  bool          // two points or more that knew the figure
	RetriesUpperBound bool
	// Full says the samples reach back to the window's start: the figures
	// are the whole window's, to within a sample interval. Span alone
	// cannot say it: an interval that does not divide the hour leaves
	// between one and two intervals of it uncovered, by when the read falls.
	Full bool
}

// over returns the increase of each count over the points since now−d, as
// Prometheus's increase() does: a count that goes down was reset (a
// broker restart, a deleted stats hash) and counts from 0 again.
func (r *ring) over(now time.Time, d time.Duration) rates {
	var out rates
	first := -1
	for i := 0; i < r.n; i++ {
		if !r.at(i).at.Before(now.Add(-d)) {
			first = i
			break
		}
	}
	if first < 0 {
		return out
	}
	out.Full = !r.at(0).at.After(now.Add(-d))
	out.Since = r.at(first).at
	out.Span = r.at(r.n - 1).at.Sub(out.Since)
	var retries int64
	for i := first + 1; i < r.n; i++ {
		prev, cur := r.at(i-1), r.at(i)
		if prev.retriesOK && cur.retriesOK {
			retries += increase(prev.retries, cur.retries)
			out.RetriesOK = true
			out.RetriesUpperBound = out.RetriesUpperBound || cur.bound
		}
		if prev.ingestOK && cur.ingestOK {
			out.Ingested += increase(prev.ingested, cur.ingested)
			out.IngOK = true
		}
	}
	if out.RetriesOK && out.Span > 0 {
		out.Retries = float64(retries) / out.Span.Seconds()
	}
	return out
}

func increase(prev, cur int64) int64 {
	if cur < prev {
		return cur // reset: counted from 0 again
	}
	return cur - prev
}

// history is the rings of every queue, filled by sample.
type history struct {
	c     *exporter.Collector
	every time.Duration
	now   func() time.Time

	mu    sync.Mutex
	rings map[string]*ring
	start time.Time // the first sample that read anything; zero before
	err   string    // the last sample's error, "" when it read
}

// historySize is how many points cover the window at one every every, and
// one more: the window's first point is then at least an hour old.
func historySize(every time.Duration) int {
	return int((historyWindow+every-1)/every) + 1
}

func newHistory(c *exporter.Collector, every time.Duration, queues []string) *history {
	h := &history{c: c, every: every, now: time.Now, rings: map[string]*ring{}}
	for _, q := range queues {
		h.rings[q] = newRing(historySize(every))
	}
	return h
}

// run samples every h.every until ctx ends, the first at once.
func (h *history) run(ctx context.Context) {
	t := time.NewTicker(h.every)
	defer t.Stop()
	for {
		h.sample(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sample reads the exporter's totals once into the rings; a queue the
// read missed gets no point (a gap, not a zero).
func (h *history) sample(ctx context.Context) {
	ts, err := h.c.Totals(ctx)
	if ctx.Err() != nil {
		return // cut short by Close: not a failed sample for the page to show
	}
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.err = ""
	if err != nil {
		h.err = err.Error()
	}
	for _, t := range ts {
		r := h.rings[t.Queue]
		if r == nil {
			continue
		}
		if t.Err != nil {
			h.err = fmt.Sprintf("%s: %v", t.Queue, t.Err)
			continue
		}
		r.push(point{at: now, retries: t.Retries, ingested: t.Ingested, retriesOK: t.RetriesKnown, ingestOK: t.IngestedKnown, bound: t.RetriesUpperBound})
		if h.start.IsZero() {
			h.start = now
		}
	}
}

// read returns each queue's rates over the last hour, when the samples
// began (zero: none yet), and the last sample's error.
func (h *history) read() (map[string]rates, time.Time, string) {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]rates, len(h.rings))
	for q, r := range h.rings {
		out[q] = r.over(now, historyWindow)
	}
	return out, h.start, h.err
}
