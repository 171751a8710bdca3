package casetest

import "testing"

func TestResolveThenNormalise(t *testing.T) {
	const base, end = 1700000000000, 1700000000050
	known := map[int64]bool{0: true}
	got := Resolve(`{"at": {now}, "due": {now+5000}, "was": "{now-60000}", "n": 12}`, base, known)
	want := `{"at": 1700000000000, "due": 1700000005000, "was": "1699999940000", "n": 12}`
	if got != want {
		t.Fatalf("Resolve = %s, want %s", got, want)
	}
	if !known[5000] || !known[-60000] {
		t.Fatalf("known offsets %v, want 0, 5000 and -60000", known)
	}
	// 1700000000020 happened during the case: {now}; 1700000005030 is the
	// known offset 5000 after a time in [base, end]; 1800000000000 is none.
	got = Normalise(`[1700000000020, 1700000005030, 1699999940000, 1800000000000, 17000000000200]`, base, end, known)
	want = `[{now}, {now+5000}, {now-60000}, 1800000000000, 17000000000200]`
	if got != want {
		t.Fatalf("Normalise = %s, want %s", got, want)
	}
}
