package eventually

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestWait(t *testing.T) {
	// A zero deadline checks once and gives up at the first miss.
	calls := 0
	if err := Wait(0, func() bool { calls++; return false }); err != ErrTimeout || calls != 1 {
		t.Fatalf("Wait(0) = %v after %d checks, want ErrTimeout after 1", err, calls)
	}
	calls = 0
	True(t, time.Minute, "the third check", func() bool { calls++; return calls == 3 })
	if calls != 3 {
		t.Fatalf("True returned after %d checks, want 3", calls)
	}
}

// The detector behind TestNoSleepInTests finds a sleep however "time" is
// imported, and ignores comments, strings and other packages' Sleep.
func TestSleepsFindsEveryForm(t *testing.T) {
	src := `package x

import (
	clock "time"
	"fmt"
)

type fake struct{}

func (fake) Sleep(clock.Duration) {}

func f() {
	clock.Sleep(1) // found
	fmt.Println("time.Sleep(1)") // time.Sleep in a string and a comment
	fake{}.Sleep(1)
	go func(s func(clock.Duration)) {}(clock.Sleep) // found: passed as a func
}
`
	path := filepath.Join(t.TempDir(), "x_test.go")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := sleeps(t, path); len(got) != 2 || got[0] != 13 || got[1] != 16 {
		t.Fatalf("sleeps found on lines %v, want [13 16]", got)
	}
}
