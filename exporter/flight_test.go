package exporter

import (
	"reflect"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
)

// TestConcurrentScrapesShareOne holds the first scrape's pipeline in Redis
// until nine more scrapes wait for it: Redis sees one pipeline, and all ten
// scrapes report the same values.
func TestConcurrentScrapesShareOne(t *testing.T) {
	rdb := redistest.Start(t).Client()
	fill(t, rdb, "q", 3, 10, 2)
	hook := newBlockHook()
	rdb.AddHook(hook)
	t.Cleanup(hook.Release)
	c, _ := newTestCollector(t, rdb, WithClientPipelines(), WithQueues(QueueFor("q0"), QueueFor("q1"), QueueFor("q2")))

	results := make([]map[string]float64, 10)
	var wg sync.WaitGroup
	scrape := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = gather(t, c)
		}()
	}
	scrape(0)
	<-hook.entered // the first scrape's pipeline is in Redis
	for i := 1; i < 10; i++ {
		scrape(i)
	}
	deadline := time.Now().Add(10 * time.Second)
	for c.flight.waiting() < 9 {
		if time.Now().After(deadline) {
			t.Fatalf("%d scrapes wait, want 9", c.flight.waiting())
		}
		runtime.Gosched()
	}
	hook.Release()
	wg.Wait()

	if n := len(hook.entered); n != 0 {
		t.Errorf("%d more pipelines ran, want none", n)
	}
	if results[0]["backstop_up"] != 1 || results[0]["backstop_queues"] != 3 {
		t.Fatalf("first scrape: %v", results[0])
	}
	for i, r := range results[1:] {
		if !reflect.DeepEqual(r, results[0]) {
			t.Errorf("scrape %d differs from the first:\n%v\n%v", i+1, r, results[0])
		}
	}
	// A scrape after that one ended reads Redis again.
	gather(t, c)
	if n := len(hook.entered); n != 1 {
		t.Errorf("%d pipelines after the shared scrape, want 1", n)
	}
}
