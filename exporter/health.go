package exporter

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	upDesc       = newDesc("up", "Whether Redis answered the last scrape (1), or could not be reached, authenticated with or did not answer in time (0).")
	durationDesc = newDesc("scrape_duration_seconds", "How long the last scrape of Redis took.")
	partialDesc  = newDesc("scrape_partial", "Whether the last scrape missed some queues' metrics (1), because its time budget ran out or Redis (or a node) could not be reached.")
	errorsDesc   = newDesc("scrape_errors_total", "Scrapes that met at least one error of this kind (connection, auth, timeout, wrong_type, reply).", "kind")
	queuesDesc   = newDesc("queues", "Queues the last scrape read, configured and discovered.")
)

// health adds the exporter's own metrics to the scrape's, counts its
// errors and logs those about Redis as a whole.
func (c *Collector) health(s *sink, queues int, took time.Duration) []prometheus.Metric {
	up, partial := 0.0, 0.0
	if s.pinged {
		up = 1
	}
	for kind, err := range s.kinds {
		switch kind {
		case kindConnection, kindAuth:
			up, partial = 0, 1
			c.cfg.log.Error("scrape failed", "kind", kind, "err", err)
		case kindTimeout:
			partial = 1
			c.cfg.log.Error("scrape failed", "kind", kind, "budget", c.cfg.timeout, "err", err)
		}
	}
	s.gauge(upDesc, up)
	s.gauge(partialDesc, partial)
	s.gauge(durationDesc, took.Seconds())
	s.gauge(queuesDesc, float64(queues))
	c.mu.Lock()
	defer c.mu.Unlock()
	for kind := range s.kinds {
		c.errs[kind]++
	}
	for _, kind := range kinds {
		s.counter(errorsDesc, c.errs[kind], kind)
	}
	return s.metrics
}
