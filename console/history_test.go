package console

import (
	"context"
	"testing"
	"time"

	"github.com/backstop-dev/backstop/exporter"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
)

// The ring keeps its last len points and drops the oldest: pushing ten
// times its size wraps it and never grows it (the console's memory stays
// flat however long it runs), and the figures are the window's.
func TestRingIsBoundedAndWraps(t *testing.T) {
	const size = 5
	r := newRing(size)
	t0 := time.Unix(1_700_000_000, 0)
	for i := range 10 * size {
		r.push(point{at: t0.Add(time.Duration(i) * time.Minute), retries: int64(i) * 60, ingested: int64(i), retriesOK: true, ingestOK: true})
		if r.n > size || len(r.buf) != size || cap(r.buf) != size {
			t.Fatalf("after %d points: n %d, len %d, cap %d; want at most %d", i+1, r.n, len(r.buf), cap(r.buf), size)
		}
	}
	for i := range size { // the last five, oldest first
		if got, want := r.at(i).ingested, int64(10*size-size+i); got != want {
			t.Errorf("point %d: %d, want %d", i, got, want)
		}
	}
	if allocs := testing.AllocsPerRun(100, func() { r.push(point{at: t0}) }); allocs != 0 {
		t.Errorf("push allocates %v times, want 0", allocs)
	}
}

// over reads the points of the window, as rate() and increase() would:
// one retry a second, one dead letter a minute; a count that goes down
// was reset and counts from 0 again; a point that did not know a figure
// leaves it out.
func TestRingOver(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	min := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Minute) }
	r := newRing(historySize(time.Minute))
	if got := r.over(t0, time.Hour); !got.Since.IsZero() || got.RetriesOK || got.IngOK {
		t.Fatalf("empty: %+v", got)
	}
	for i := range 90 {
		r.push(point{at: min(i), retries: int64(i) * 60, ingested: int64(i), retriesOK: true, ingestOK: true})
	}
	got := r.over(min(89), time.Hour)
	if !got.Since.Equal(min(29)) || got.Span != time.Hour || got.Retries != 1 || got.Ingested != 60 || !got.RetriesOK || !got.IngOK || !got.Full {
		t.Errorf("last hour of 90 minutes: %+v, want since minute 29, 1 retry/s, 60 ingested", got)
	}
	r.push(point{at: min(90), retries: 30, ingested: 2, retriesOK: true, ingestOK: true}) // reset: 30 and 2 since; the window now starts at minute 30
	if got := r.over(min(90), time.Hour); got.Ingested != 59+2 || got.Retries != float64(59*60+30)/3600 {
		t.Errorf("after a reset: %+v", got)
	}

	r = newRing(4)
	r.push(point{at: min(0), retriesOK: true})
	if got := r.over(min(0), time.Hour); !got.Since.Equal(min(0)) || got.Span != 0 || got.RetriesOK || got.IngOK || got.Full {
		t.Errorf("one point: %+v, want since it and no figure", got)
	}
	r.push(point{at: min(1), retries: 600, retriesOK: true, bound: true})
	if got := r.over(min(1), time.Hour); got.Retries != 10 || !got.RetriesUpperBound || got.IngOK {
		t.Errorf("two points, no ingestion known: %+v", got)
	}
}

// Every interval WithExporter takes leaves the overview a figure of the
// whole hour at any time once the console has sampled for an hour: the
// last hour holds two samples however the read falls between them (at 1h,
// the bound this replaced, it held one and the overview never had a
// figure), and it says "the last hour" even where the interval does not
// divide the hour (7m: the span is 49m to 56m by when the read falls).
func TestEverySampleIntervalGivesAFigure(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	for _, every := range []time.Duration{minSampleInterval, 15 * time.Second, 7 * time.Minute, maxSampleInterval} {
		r := newRing(historySize(every))
		n := int(3*historyWindow/every) + 1
		for i := range n {
			r.push(point{at: t0.Add(time.Duration(i) * every), retriesOK: true, ingestOK: true})
		}
		last := t0.Add(time.Duration(n-1) * every)
		for _, late := range []time.Duration{0, every / 2, every - time.Millisecond} {
			if got := r.over(last.Add(late), historyWindow); !got.RetriesOK || !got.IngOK || !got.Full || got.Span <= historyWindow-2*every {
				t.Errorf("every %v, read %v after a sample: %+v, want figures of the whole hour, over more than %v", every, late, got, historyWindow-2*every)
			}
		}
	}
	if newTestServer := func(every time.Duration) error {
		_, err := New("redis", nil, WithExporter(&exporter.Collector{}, every))
		return err
	}; newTestServer(maxSampleInterval+time.Second) == nil || newTestServer(minSampleInterval-time.Millisecond) == nil {
		t.Errorf("New takes a sample interval outside %v..%v", minSampleInterval, maxSampleInterval)
	}
}

// A sample that Close cuts short leaves no error for the overview, which
// serves on after Close: its last figures, not "Last sample failed:
// context canceled".
func TestSampleCutShortIsNoFailure(t *testing.T) {
	c, err := exporter.NewCollector(redistest.Start(t).Client(), exporter.WithQueues(exporter.QueueFor("q")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h := newHistory(c, time.Second, []string{"q"})
	h.sample(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	h.sample(ctx)
	if rs, since, err := h.read(); err != "" || since.IsZero() || rs["q"].Since.IsZero() {
		t.Errorf("after a sample and one cut short: %+v since %v, error %q; want the first sample and no error", rs, since, err)
	}
}
