// Package rules generates backstop's Prometheus recording and alerting
// rules from one configuration (selectors, thresholds, `for` durations,
// per-alert toggles), as the monitoring mixins do. The shipped
// rules/*.yml are its output for the defaults; a test keeps them in sync.
package rules

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"

	"go.yaml.in/yaml/v3"
)

// Config is the rules configuration (rules/config.yaml documents it).
type Config struct {
	// Selector is added to every metric selector, e.g. `job="backstop"`.
	Selector string `yaml:"selector"`
	// RunbookURL is the base of every runbook_url; the alert's anchor is
	// appended.
	RunbookURL string `yaml:"runbook_url"`
	// GrafanaURL is the Grafana the dashboard_url annotations link to,
	// with no trailing slash: a queue alert links to the queue dashboard
	// with its queue selected, GrafanaURL/d/backstop-queue/backstop-queue?var-queue=Q
	// (an absolute URL: Alertmanager's receivers cannot resolve a path).
	GrafanaURL string `yaml:"grafana_url"`
	// ConsoleURL is the DLQ console (`backstop console`) the dead-letter
	// alerts link to in a console_url annotation, with no trailing slash:
	// CONSOLE/queues/Q/dlq, the queue's dead letters (filtered by reason
	// when the alert has one). Empty (the default): no console_url.
	ConsoleURL string `yaml:"console_url"`

	DLQPagePerSecond    float64  `yaml:"dlq_page_per_second"`   // sustained DLQ ingestion that pages
	DLQRateWindow       string   `yaml:"dlq_rate_window"`       // ... measured over this window (shorter than dlq_page_for: one burst does not page)
	DLQPageFor          string   `yaml:"dlq_page_for"`          // ... for this long
	DeadLetterFor       string   `yaml:"dead_letter_for"`       // BackstopDeadLetter: new dead letters seen for this long (a ticket)
	DLQDepthThreshold   float64  `yaml:"dlq_depth_threshold"`   // the DLQ holds more entries than this (backstop_dlq_size)...
	DLQDepthFor         string   `yaml:"dlq_depth_for"`         // ... for this long: dead letters nobody replayed or deleted
	RetryRatioWarning   float64  `yaml:"retry_ratio_warning"`   // share of attempt outcomes that are retries (per queue, and per job type)
	RetryRatioFor       string   `yaml:"retry_ratio_for"`       //
	OverdueSeconds      float64  `yaml:"overdue_seconds"`       // oldest overdue delayed job: the scheduler stalled
	OverdueFor          string   `yaml:"overdue_for"`           //
	DelayedGrowthJobs   float64  `yaml:"delayed_growth_jobs"`   // the delayed set holds more than this (backstop_delayed_queue_size)...
	DelayedGrowthWindow string   `yaml:"delayed_growth_window"` // ... and grew over this window (deriv)...
	DelayedGrowthFor    string   `yaml:"delayed_growth_for"`    // ... for this long
	CrashLoopDeliveries int      `yaml:"crash_loop_deliveries"` // a pending entry delivered more often than this (an le bucket of backstop_stream_pending_deliveries_bucket: 1, 2, 3, 5 or 10)
	CrashLoopFor        string   `yaml:"crash_loop_for"`        //
	LagJobsWarning      float64  `yaml:"lag_jobs_warning"`      // stream lag above this and growing
	LagFor              string   `yaml:"lag_for"`               //
	DownFor             string   `yaml:"down_for"`              // backstop_up == 0 or the exporter gone
	RejectedWritesFor   string   `yaml:"rejected_writes_for"`   // Redis refusing writes (OOM, MISCONF, READONLY, NOREPLICAS) for this long
	MemoryRatioWarning  float64  `yaml:"memory_ratio_warning"`  // Redis used memory over this share of maxmemory
	MemoryFor           string   `yaml:"memory_for"`            //
	LimitFor            string   `yaml:"limit_for"`             // the exporter hitting a bound (max keys, timeout, stats labels) on every scrape
	OldestJobSeconds    float64  `yaml:"oldest_job_seconds"`    // the oldest job not finished is older than this: a stuck queue, even when nothing fails
	OldestJobFor        string   `yaml:"oldest_job_for"`        //
	TailAttempts        int      `yaml:"tail_attempts"`         // a job finished on an attempt above this needed a large share of its attempts (an le bucket of backstop_job_attempts)
	TailRatio           float64  `yaml:"tail_ratio"`            // share of finished jobs above tail_attempts that warns
	TailWindow          string   `yaml:"tail_window"`           // ... measured over this window
	TailFor             string   `yaml:"tail_for"`              //
	Disabled            []string `yaml:"disabled_alerts"`       // alert names to leave out

	// ClientSelector is added to the selectors of the process metrics
	// (backstop_client_*), which services export under their own jobs:
	// Selector, which names the exporter's job, does not apply to them.
	ClientSelector          string  `yaml:"client_selector"`
	ClientRetryRatioWarning float64 `yaml:"client_retry_ratio_warning"` // share of a policy and target's attempts that are retries
	ClientRetryRatioFor     string  `yaml:"client_retry_ratio_for"`     //
	CircuitStuckWindow      string  `yaml:"circuit_stuck_window"`       // a breaker seen open or half-open, never closed, over this window...
	CircuitStuckFor         string  `yaml:"circuit_stuck_for"`          // ... for this long
	// RetryLatencyMarginSeconds: the measured retry latency's p99 above
	// the decided delay's p99 by more than this, for RetryLatencyFor, warns
	// (BackstopClientRetryLatencyHigh: a stalled promoter or mover, busy
	// workers).
	RetryLatencyMarginSeconds float64 `yaml:"client_retry_latency_margin_seconds"`
	RetryLatencyFor           string  `yaml:"client_retry_latency_for"`

	// IdempotencyStoreErrorsFor: services' idempotency stores
	// (backstop_idempotency_*, under ClientSelector) failing for this long.
	IdempotencyStoreErrorsFor string `yaml:"idempotency_store_errors_for"`
}

// Default is the configuration of the shipped rule files.
func Default() Config {
	return Config{
		Selector:         `job="backstop"`,
		RunbookURL:       "https://github.com/backstop-dev/backstop/blob/main/docs/runbooks.md",
		GrafanaURL:       "http://localhost:3000",
		DLQPagePerSecond: 0.05,
		DLQRateWindow:    "2m",
		DLQPageFor:       "5m",
		// One scrape's increase is not enough to open a ticket: a dead
		// letter is seen on two evaluations a minute apart.
		DeadLetterFor: "1m",
		// Any dead letter still held after an hour: BackstopDeadLetter
		// resolves 10 minutes after the last new one, and a DLQ nobody
		// drained would sit unseen. 0 because every entry is a job that
		// will not run without a person; 1h (not 15m) so the replay or
		// delete that follows a BackstopDeadLetter ticket has time to
		// happen before a second ticket says the same thing.
		DLQDepthThreshold: 0,
		DLQDepthFor:       "1h",
		// The project's figure (issue 27): retries above 5-10% of the
		// attempts for 5 minutes mean a dependency is degrading. 0.1, the
		// top of that band, keeps a healthy queue's few retries (a
		// client's blips, a deploy) quiet; 5m, not 15m: with the 5m rate
		// window the warning comes about 10 minutes after the rise, not
		// 20. It is a warning (a ticket), so a false one costs little.
		RetryRatioWarning: 0.1,
		RetryRatioFor:     "5m",
		OverdueSeconds:    300,
		OverdueFor:        "5m",
		// A delayed set above 100 jobs that has grown over the last hour,
		// for 2 hours: retries are scheduled faster than they come due for
		// 3 hours, a dependency down longer than a blip with jobs piling up
		// behind it (a stalled scheduler is BackstopDelayedQueueStalled).
		// The floor keeps a handful of retries from counting as growth.
		DelayedGrowthJobs:   100,
		DelayedGrowthWindow: "1h",
		DelayedGrowthFor:    "2h",
		CrashLoopDeliveries: 3,
		CrashLoopFor:        "10m",
		LagJobsWarning:      1000,
		LagFor:              "15m",
		DownFor:             "2m",
		RejectedWritesFor:   "1m",
		MemoryRatioWarning:  0.9,
		MemoryFor:           "10m",
		LimitFor:            "15m",
		OldestJobSeconds:    3600,
		OldestJobFor:        "5m",
		// 3 for the default preset's 5 attempts: a job past its third
		// used more than half its budget. Cloud Tasks-like policies
		// (max_attempts 100, 0.1s doubling 16 times to the 1h cap) set
		// 20: attempt 20 comes after 4h49m of waits, the third hourly
		// retry past the cap (docs/runbooks.md#backstopattemptstailheavy).
		TailAttempts: 3,
		TailRatio:    0.5,
		TailWindow:   "30m",
		TailFor:      "15m",

		// The same figure as the queues' (RetryRatioWarning).
		ClientRetryRatioWarning:   0.1,
		ClientRetryRatioFor:       "5m",
		CircuitStuckWindow:        "10m",
		RetryLatencyMarginSeconds: 30,
		RetryLatencyFor:           "10m",
		CircuitStuckFor:           "5m",

		IdempotencyStoreErrorsFor: "2m",
	}
}

// maxConfigBytes bounds a configuration file: rules/config.yaml is under
// 2 KB, and a path to a huge file or a device must not fill memory.
const maxConfigBytes = 1 << 20

// LoadConfig reads a configuration file over the defaults. Unknown fields
// are errors, and so is a file over 1 MiB (it reads no further).
func LoadConfig(path string) (Config, error) {
	c := Default()
	f, err := os.Open(path)
	if err != nil {
		return c, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return c, err
	}
	if len(b) > maxConfigBytes {
		return c, fmt.Errorf("%s: must be at most %d bytes (1 MiB)", path, maxConfigBytes)
	}
	// dashboard_url (a path) became grafana_url (issue 42): say so rather
	// than "unknown field".
	var keys map[string]any
	if yaml.Unmarshal(b, &keys) == nil {
		if _, old := keys["dashboard_url"]; old {
			return c, fmt.Errorf("%s: dashboard_url is replaced by grafana_url, your Grafana's URL (e.g. https://grafana.example.com): "+
				"the alerts link to GRAFANA/d/backstop-queue/backstop-queue with their queue selected", path)
		}
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	return c, c.validate()
}

// attemptBuckets are the le bounds of backstop_job_attempts below +Inf
// (the exporter's attemptBuckets: a test there checks rules accepts each).
var attemptBuckets = []int{1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50}

func (c Config) validate() error {
	switch {
	case c.DLQPagePerSecond <= 0:
		return fmt.Errorf("dlq_page_per_second: must be > 0 (got %v)", c.DLQPagePerSecond)
	case c.DLQDepthThreshold < 0:
		return fmt.Errorf("dlq_depth_threshold: must be >= 0 (got %v)", c.DLQDepthThreshold)
	case c.DelayedGrowthJobs < 0:
		return fmt.Errorf("delayed_growth_jobs: must be >= 0 (got %v)", c.DelayedGrowthJobs)
	case c.ClientRetryRatioWarning <= 0 || c.ClientRetryRatioWarning >= 1:
		return fmt.Errorf("client_retry_ratio_warning: must be in (0, 1) (got %v)", c.ClientRetryRatioWarning)
	case c.RetryLatencyMarginSeconds <= 0:
		return fmt.Errorf("client_retry_latency_margin_seconds: must be > 0 (got %v)", c.RetryLatencyMarginSeconds)
	case c.RetryRatioWarning <= 0 || c.RetryRatioWarning >= 1:
		return fmt.Errorf("retry_ratio_warning: must be in (0, 1) (got %v)", c.RetryRatioWarning)
	case c.MemoryRatioWarning <= 0 || c.MemoryRatioWarning > 1:
		return fmt.Errorf("memory_ratio_warning: must be in (0, 1] (got %v)", c.MemoryRatioWarning)
	case c.OldestJobSeconds <= 0:
		return fmt.Errorf("oldest_job_seconds: must be > 0 (got %v)", c.OldestJobSeconds)
	case c.TailRatio <= 0 || c.TailRatio >= 1:
		return fmt.Errorf("tail_ratio: must be in (0, 1) (got %v)", c.TailRatio)
	case !slices.Contains(attemptBuckets, c.TailAttempts):
		return fmt.Errorf("tail_attempts: must be an le bucket of backstop_job_attempts: %v (got %d)", attemptBuckets, c.TailAttempts)
	case c.CrashLoopDeliveries != 1 && c.CrashLoopDeliveries != 2 && c.CrashLoopDeliveries != 3 && c.CrashLoopDeliveries != 5 && c.CrashLoopDeliveries != 10:
		return fmt.Errorf("crash_loop_deliveries: must be an le bucket of backstop_stream_pending_deliveries: 1, 2, 3, 5 or 10 (got %d)", c.CrashLoopDeliveries)
	}
	return nil
}
