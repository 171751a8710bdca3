package exporter

import (
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
)

// scrapeMemory serves one scrape through the handler, gzipped as
// Prometheus asks, and returns the bytes per queue it allocated and the
// bytes per queue it holds at its peak: the samples and the body, which
// every concurrent request shares.
func scrapeMemory(tb testing.TB, c *Collector, queues int) (alloc, live float64, size int) {
	h := c.Handler(nil).(*handler)
	key := bodyKey{format: expfmt.FmtOpenMetrics_1_0_0, gzip: true}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	resp := h.join()
	body, err := resp.body(key, h.encode)
	if err != nil {
		tb.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(resp)
	n := float64(queues)
	return float64(after.TotalAlloc-before.TotalAlloc) / n, (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / n, len(body)
}

// maxLivePerQueue bounds what one scrape holds per queue of the shape
// fill writes (one group with pending entries, a delayed set, a DLQ, a
// stats hash: 20 samples, 41 lines of text). Before the handler it held
// about 14 KB: the samples, a dto.Metric per sample from the registry, and
// the whole text.
const maxLivePerQueue = 2500

// TestMemoryPerQueue measures the memory one scrape of 1,000 queues holds
// and allocates, per queue, and bounds the first.
func TestMemoryPerQueue(t *testing.T) {
	rdb := redistest.Start(t).Client()
	const n = 1000
	qs := fill(t, rdb, "q", n, 60, 50)
	c, _ := newTestCollector(t, rdb, WithQueues(qs...))
	scrapeMemory(t, c, n) // warm the connections
	alloc, live, size := scrapeMemory(t, c, n)
	t.Logf("per queue: %.0f bytes held at the peak, %.0f allocated, %.0f of gzipped body", live, alloc, float64(size)/n)
	if live > maxLivePerQueue {
		t.Errorf("a scrape holds %.0f bytes per queue, want at most %d", live, maxLivePerQueue)
	}
}

// BenchmarkScrapeMemory reports the memory of one scrape through the
// handler per queue (see BENCHMARKS.md):
//
//	go test -run '^$' -bench ScrapeMemory -benchtime 3x ./exporter/
func BenchmarkScrapeMemory(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(strconv.Itoa(n)+"_queues", func(b *testing.B) {
			srv := redistest.Start(b)
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
			b.Cleanup(func() { rdb.Close() })
			qs := fill(b, rdb, "q", n, 60, 50)
			c, _ := newTestCollector(b, rdb, WithQueues(qs...), WithTimeout(time.Minute))
			scrapeMemory(b, c, n)
			var alloc, live, size float64
			b.ResetTimer()
			for range b.N {
				a, l, s := scrapeMemory(b, c, n)
				alloc, live, size = alloc+a, live+l, size+float64(s)
			}
			b.ReportMetric(live/float64(b.N), "B-held/queue")
			b.ReportMetric(alloc/float64(b.N), "B-alloc/queue")
			b.ReportMetric(size/float64(b.N)/float64(n), "B-gzip/queue")
		})
	}
}

// BenchmarkScrapeCPU times scrapes of 1,000 queues through the handler, as
// BenchmarkScrapeMemory's but without its forced GCs, over the collector's
// own connection and over the client's pipelines (WithClientPipelines, the
// way a cluster is read), in turn, and the exposition alone (gzipped
// OpenMetrics): the profile to read for where a scrape's CPU goes
// (BENCHMARKS.md). cpu-ms/op is the process's CPU time
// per scrape (Redis's is its own process's).
//
//	go test -run '^$' -bench ScrapeCPU -benchtime 100x -cpuprofile cpu.out ./exporter/
func BenchmarkScrapeCPU(b *testing.B) {
	srv := redistest.Start(b)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	b.Cleanup(func() { rdb.Close() })
	qs := fill(b, rdb, "q", 1000, 60, 50)
	for _, transport := range []string{"own", "client"} {
		b.Run("transport="+transport, func(b *testing.B) {
			opts := []Option{WithQueues(qs...), WithTimeout(time.Minute)}
			if transport == "client" {
				opts = append(opts, WithClientPipelines())
			}
			c, _ := newTestCollector(b, rdb, opts...)
			h := c.Handler(nil).(*handler)
			key := bodyKey{format: expfmt.FmtOpenMetrics_1_0_0, gzip: true}
			b.ReportAllocs()
			start := processCPU()
			for b.Loop() {
				resp := h.join()
				if _, err := resp.body(key, h.encode); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(processCPU()-start)/1e6/float64(b.N), "cpu-ms/op")
		})
	}
	// The exposition alone: one collection, encoded again and again.
	b.Run("part=exposition", func(b *testing.B) {
		c, _ := newTestCollector(b, rdb, WithQueues(qs...), WithTimeout(time.Minute))
		h := c.Handler(nil).(*handler)
		key := bodyKey{format: expfmt.FmtOpenMetrics_1_0_0, gzip: true}
		resp := h.join()
		b.ReportAllocs()
		start := processCPU()
		for b.Loop() {
			if _, err := h.encode(resp, key); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(processCPU()-start)/1e6/float64(b.N), "cpu-ms/op")
	})
}

// processCPU is the CPU time this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
