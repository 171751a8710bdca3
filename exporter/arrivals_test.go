package exporter

import (
	"testing"
	"time"
)

// Issue 45: the arrival curve gives the age of the oldest message still in
// a first-in-first-out queue, a lower bound in every case, and forgets
// what is gone.
func TestArrivalsOldestAge(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	var a arrivals
	steps := []struct {
		min          int
		in, messages int64
		want         time.Duration
	}{
		{0, 10, 3, 0},                 // the exporter starts: 3 there, of unknown age
		{30, 10, 3, 30 * time.Minute}, // nothing moves: stuck
		{61, 12, 5, 61 * time.Minute}, // 2 more arrive, none leaves
		{62, 12, 2, time.Minute},      // 3 leave: the oldest left arrived by minute 61
		{70, 15, 1, 0},                // all but the newest leave: it arrived by minute 70
		{80, 15, 0, 0},                // empty
		{90, 16, 1, 0},                // one arrives after the empty scrape
		{95, 16, 1, 5 * time.Minute},
		{96, 3, 3, 0},                // counts go back: a broker restart starts again
		{99, 3, 3, 3 * time.Minute},  //
		{100, 4, 5, 4 * time.Minute}, // depth ahead of the counts (statistics lag): still the first sample
	}
	for _, s := range steps {
		if got := a.observe(at(s.min), s.in, s.messages); got != s.want {
			t.Errorf("minute %d (in %d, messages %d): age %v, want %v", s.min, s.in, s.messages, got, s.want)
		}
	}
}

// A stuck queue that keeps receiving keeps a bounded curve, and its age is
// still measured from the first scrape that saw its oldest message.
func TestArrivalsBounded(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	var a arrivals
	var got time.Duration
	for i := range 10_000 {
		got = a.observe(t0.Add(time.Duration(i)*15*time.Second), int64(100+i), int64(1+i))
		if len(a.s) > maxArrivalSamples+1 {
			t.Fatalf("scrape %d: %d samples kept", i, len(a.s))
		}
	}
	if want := 9999 * 15 * time.Second; got != want {
		t.Errorf("age after 10,000 scrapes of a stuck queue: %v, want %v", got, want)
	}
}
