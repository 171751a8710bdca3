package host_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/backstop-dev/backstop/host"
)

// policy3900 is a policy of about 3.9 KB: a long classification table.
func policy3900() []byte {
	var b strings.Builder
	b.WriteString(`{"max_attempts": 8, "backoff": {"strategy": "exponential", "base": "1s", "multiplier": 2, "cap": "300s"}, "classify": {"http": {`)
	for code := 100; b.Len() < 3850; code++ {
		if code > 100 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, `"%d": "permanent"`, code)
	}
	b.WriteString(`}}}`)
	return []byte(b.String())
}

const page = 64 << 10

// Loading and closing a policy over and over keeps the module's memory
// flat. It used to grow without bound from about the 1,100th cycle (the Go
// runtime's GC CPU limiter, on wazero's fake clock, stopped the GC for
// good: see wasm/ABI.md, "Clocks"), past 1,400 pages by the 1,500th, and
// the instance trapped after about 15,800.
func TestLoadCloseMemoryIsBounded(t *testing.T) {
	ctx := context.Background()
	rt, err := host.New(ctx, host.SharedCache(), host.WithPoolSize(1))
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	data := policy3900()
	const cycles, bound = 1500, 400 // pages; about 150 are used
	for i := range cycles {
		p, err := rt.Load(ctx, data)
		if err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		p.Close(ctx)
	}
	if pages := host.MemorySize(rt) / page; pages > bound {
		t.Errorf("after %d load/close cycles the module has %d pages of memory, want <= %d", cycles, pages, bound)
	}
}
