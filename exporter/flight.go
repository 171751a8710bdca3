package exporter

import "sync"

// flight runs one scrape at a time: a scrape that arrives while one is
// running waits for it and shares its result, so N Prometheus servers (or
// a retrying one) cost Redis one collection. One that arrives after it
// finished starts a new one: results are never cached.
type flight struct {
	mu  sync.Mutex
	cur *call
}

type call struct {
	done    chan struct{}
	samples *samples
	waiters int // scrapes sharing this call: for tests
}

func (f *flight) do(scrape func() *samples) *samples {
	f.mu.Lock()
	if c := f.cur; c != nil {
		c.waiters++
		f.mu.Unlock()
		<-c.done
		return c.samples
	}
	c := &call{done: make(chan struct{})}
	f.cur = c
	f.mu.Unlock()

	defer func() {
		f.mu.Lock()
		f.cur = nil
		f.mu.Unlock()
		close(c.done)
	}()
	c.samples = scrape()
	return c.samples
}

// waiting returns how many scrapes wait for the running one.
func (f *flight) waiting() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cur == nil {
		return 0
	}
	return f.cur.waiters
}
