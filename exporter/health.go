package exporter

import (
	"time"
)

var (
	upDesc       = newDesc("up", "Whether Redis (or the RabbitMQ management API) answered the last scrape (1), or could not be reached, authenticated with or did not answer in time (0).")
	durationDesc = newDesc("scrape_duration_seconds", "How long the last scrape of Redis took.")
	partialDesc  = newDesc("scrape_partial", "Whether the last scrape missed some queues' metrics (1): its time budget ran out, Redis (or a node) could not be reached, or discovery stopped at --queues.max-keys.")
	errorsDesc   = newDesc("scrape_errors_total", "Scrapes that met at least one error of this kind (connection, auth, timeout, wrong_type, reply; stats: a stats hash whose per-type counters exceed the queue's totals, its untyped rest clamped to 0).", "kind")
	queuesDesc   = newDesc("queues", "Queues the last scrape read, configured and discovered.")
	limitDesc    = newDesc("scrape_limit_reached", "Whether the last scrape hit this bound of the exporter (1): max_keys (discovery stopped at --queues.max-keys: queues are not read), pending_sample (a group has more pending entries than its XPENDING sample: backstop_stream_pending_deliveries covers the oldest only), stats_labels (a queue's stats hash has more reasons or outcomes than are reported: the rest are left out), job_types (a queue's stats hash has more job types than are reported by name: the rest are counted as job_type=\"other\"), timeout (the time budget ran out: metrics are missing).", "limit")
	discKeysDesc = newDesc("discovery_keys", "Keys matching --queues.pattern in the last discovery, by outcome: queue (a key of a queue now read), skipped (not exactly a key of the default layout, or a queue name that cannot be a label value), over_limit (past --queues.max-keys: not read).", "outcome")
)

// The bounds of a scrape, the label of backstop_scrape_limit_reached.
const (
	limitMaxKeys       = "max_keys"
	limitPendingSample = "pending_sample"
	limitStatsLabels   = "stats_labels"
	limitJobTypes      = "job_types"
	limitTimeout       = "timeout"
)

var limits = []string{limitMaxKeys, limitPendingSample, limitStatsLabels, limitJobTypes, limitTimeout}

// health adds the exporter's own metrics to the scrape's, counts its
// errors and logs those about Redis as a whole.
func (c *Collector) health(s *sink, queues int, took time.Duration) *samples {
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
			s.reached(limitTimeout)
			c.cfg.log.Error("scrape failed", "kind", kind, "budget", c.cfg.timeout, "err", err)
		}
	}
	if f := s.found; f != nil {
		if f.overLimit > 0 {
			partial = 1
			s.reached(limitMaxKeys)
		}
		s.gauge(discKeysDesc, float64(f.queueKeys), "queue")
		s.gauge(discKeysDesc, float64(f.skipped), "skipped")
		s.gauge(discKeysDesc, float64(f.overLimit), "over_limit")
	}
	s.gauge(upDesc, up)
	s.gauge(partialDesc, partial)
	s.gauge(durationDesc, took.Seconds())
	s.gauge(queuesDesc, float64(queues))
	for _, l := range limits {
		v := 0.0
		if s.limits[l] {
			v = 1
		}
		s.gauge(limitDesc, v, l)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for kind := range s.kinds {
		c.errs[kind]++
	}
	for _, kind := range kinds {
		s.counter(errorsDesc, c.errs[kind], kind)
	}
	return &s.samples
}
