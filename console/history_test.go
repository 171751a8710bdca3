package console

import (
	"testing"
	"time"
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
	if !got.Since.Equal(min(29)) || got.Span != time.Hour || got.Retries != 1 || got.Ingested != 60 || !got.RetriesOK || !got.IngOK {
		t.Errorf("last hour of 90 minutes: %+v, want since minute 29, 1 retry/s, 60 ingested", got)
	}
	r.push(point{at: min(90), retries: 30, ingested: 2, retriesOK: true, ingestOK: true}) // reset: 30 and 2 since; the window now starts at minute 30
	if got := r.over(min(90), time.Hour); got.Ingested != 59+2 || got.Retries != float64(59*60+30)/3600 {
		t.Errorf("after a reset: %+v", got)
	}

	r = newRing(4)
	r.push(point{at: min(0), retriesOK: true})
	if got := r.over(min(0), time.Hour); !got.Since.Equal(min(0)) || got.Span != 0 || got.RetriesOK || got.IngOK {
		t.Errorf("one point: %+v, want since it and no figure", got)
	}
	r.push(point{at: min(1), retries: 600, retriesOK: true, bound: true})
	if got := r.over(min(1), time.Hour); got.Retries != 10 || !got.RetriesUpperBound || got.IngOK {
		t.Errorf("two points, no ingestion known: %+v", got)
	}
}
