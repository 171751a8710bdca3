package rules

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// File is a Prometheus rule file.
type File struct {
	Groups []Group `yaml:"groups"`
}

// Group is a rule group.
type Group struct {
	Name     string `yaml:"name"`
	Interval string `yaml:"interval,omitempty"`
	Rules    []Rule `yaml:"rules"`
}

// Rule is a recording or alerting rule.
type Rule struct {
	Record      string            `yaml:"record,omitempty"`
	Alert       string            `yaml:"alert,omitempty"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for,omitempty"`
	Labels      map[string]string `yaml:"labels,omitempty"`
	Annotations map[string]string `yaml:"annotations,omitempty"`
}

// AlertDLQIngestion is the alert that pages on dead letters; the alerter of
// backstop-exporter posts it too, under the same name and labels.
const AlertDLQIngestion = "BackstopDLQIngestion"

// Alert returns f's alerting rule named name.
func (f File) Alert(name string) (Rule, bool) {
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert == name {
				return r, true
			}
		}
	}
	return Rule{}, false
}

// sel renders a metric selector with the configured matchers.
func (c Config) sel(metric string, matchers ...string) string {
	if c.Selector != "" {
		matchers = append([]string{c.Selector}, matchers...)
	}
	if len(matchers) == 0 {
		return metric
	}
	return metric + "{" + strings.Join(matchers, ", ") + "}"
}

// csel renders a selector of the process metrics (backstop_client_*).
func (c Config) csel(metric string, matchers ...string) string {
	return Config{Selector: c.ClientSelector}.sel(metric, matchers...)
}

// Recording returns the recording rules: the mission's figures.
func Recording(c Config) File {
	return File{Groups: []Group{{Name: "backstop.rules", Rules: []Rule{
		{Record: "queue:backstop_retry_rate:ratio_rate5m",
			Expr: fmt.Sprintf("sum by (instance, queue) (rate(%s[5m]))\n/\nsum by (instance, queue) (rate(%s[5m]))",
				c.sel("backstop_attempts_total", `outcome="retry"`), c.sel("backstop_attempts_total", `outcome!="deferred"`))},
		// Per job type (job_type="" is the untyped jobs): which kind of
		// job on a shared queue retries or dead-letters.
		{Record: "queue_job_type:backstop_retry_rate:ratio_rate5m",
			Expr: fmt.Sprintf("sum by (instance, queue, job_type) (rate(%s[5m]))\n/\nsum by (instance, queue, job_type) (rate(%s[5m]))",
				c.sel("backstop_attempts_total", `outcome="retry"`), c.sel("backstop_attempts_total", `outcome!="deferred"`))},
		{Record: "queue_job_type:backstop_dead_letters:rate5m",
			Expr: fmt.Sprintf("sum by (instance, queue, job_type) (rate(%s[5m]))", c.sel("backstop_dead_letters_total"))},
		{Record: "queue:backstop_dlq_ingestion:rate5m",
			Expr: fmt.Sprintf("sum by (instance, queue) (rate(%s[5m]))", c.sel("backstop_dlq_ingested_total"))},
		{Record: "queue_reason:backstop_retries:rate5m",
			Expr: fmt.Sprintf("sum by (instance, queue, reason) (rate(%s[5m]))", c.sel("backstop_retries_total"))},
		{Record: "queue_reason:backstop_dead_letters:rate5m",
			Expr: fmt.Sprintf("sum by (instance, queue, reason) (rate(%s[5m]))", c.sel("backstop_dead_letters_total"))},
		{Record: "queue:backstop_job_attempts:p50_rate5m",
			Expr: fmt.Sprintf("histogram_quantile(0.5, sum by (instance, queue, le) (rate(%s[5m])))", c.sel("backstop_job_attempts_bucket"))},
		{Record: "queue:backstop_job_attempts:p90_rate5m",
			Expr: fmt.Sprintf("histogram_quantile(0.9, sum by (instance, queue, le) (rate(%s[5m])))", c.sel("backstop_job_attempts_bucket"))},
		{Record: "queue:backstop_job_attempts:p99_rate5m",
			Expr: fmt.Sprintf("histogram_quantile(0.99, sum by (instance, queue, le) (rate(%s[5m])))", c.sel("backstop_job_attempts_bucket"))},
		// In-process retries: the share of calls made that were retried
		// (refused calls were never made).
		{Record: "policy_target:backstop_client_retry_ratio:ratio_rate5m",
			Expr: fmt.Sprintf("sum by (policy, target) (rate(%s[5m]))\n/\nsum by (policy, target) (rate(%s[5m]))",
				c.csel("backstop_client_attempts_total", `outcome="retry"`), c.csel("backstop_client_attempts_total", `outcome!="refused"`))},
		// Retry latency: measured (failure to the next attempt's start) and
		// decided, p99 per policy and target (a queue worker's target is its
		// queue).
		{Record: "policy_target:backstop_client_retry_latency_seconds:p99_rate5m",
			Expr: fmt.Sprintf("histogram_quantile(0.99, sum by (policy, target, le) (rate(%s[5m])))", c.csel("backstop_client_retry_latency_seconds_bucket"))},
		{Record: "policy_target:backstop_client_retry_delay_seconds:p99_rate5m",
			Expr: fmt.Sprintf("histogram_quantile(0.99, sum by (policy, target, le) (rate(%s[5m])))", c.csel("backstop_client_retry_delay_seconds_bucket"))},
		{Record: "policy_target_reason:backstop_client_calls_refused:rate5m",
			Expr: fmt.Sprintf("sum by (policy, target, reason) (rate(%s[5m]))", c.csel("backstop_client_calls_refused_total"))},
	}}}}
}

// dashboardURL is the dashboard_url of an alert whose description is
// description: the queue dashboard with the alert's queue selected when
// the alert has a queue label (its description names {{ $labels.queue }}),
// else the overview, under GrafanaURL.
func (c Config) dashboardURL(description string) string {
	if strings.Contains(description, "{{ $labels.queue }}") {
		return c.GrafanaURL + "/d/backstop-queue/backstop-queue?var-queue={{ $labels.queue | urlquery }}"
	}
	return c.GrafanaURL + "/d/backstop-overview/backstop-overview"
}

// consoleURL is the console_url of a dead-letter alert whose description
// is description: the console's list of the queue's dead letters
// (console/console.go: GET /queues/{queue}/dlq), filtered by the alert's
// reason when it has a reason label (the list's reason= parameter).
// urlquery escapes the queue as the console's path segment needs ('/' as
// %2F); queue names hold no spaces (which it would write as '+').
func (c Config) consoleURL(description string) string {
	u := c.ConsoleURL + "/queues/{{ $labels.queue | urlquery }}/dlq"
	if strings.Contains(description, "{{ $labels.reason }}") {
		u += "?reason={{ $labels.reason | urlquery }}"
	}
	return u
}

// withConsole adds the console_url annotation to a dead-letter alert when
// a console is configured: the runbooks send the operator there first.
func (c Config) withConsole(r Rule) Rule {
	if c.ConsoleURL != "" {
		r.Annotations["console_url"] = c.consoleURL(r.Annotations["description"])
	}
	return r
}

// alert builds an alerting rule with the annotations every alert carries.
func (c Config) alert(name, severity, expr, forDur, summary, description string) Rule {
	return Rule{
		Alert: name, Expr: expr, For: forDur,
		Labels: map[string]string{"severity": severity},
		Annotations: map[string]string{
			"summary":       summary,
			"description":   description,
			"runbook_url":   c.RunbookURL + "#" + strings.ToLower(name),
			"dashboard_url": c.dashboardURL(description),
		},
	}
}

// Alerts returns the alerting rules. Every alert that pages fires on the
// growth of a counter or on a condition that is live now, never on a level
// that keeps paging while a stale DLQ sits still; a DLQ that is not drained
// is a warning (BackstopDLQDepth, a ticket), held for dlq_depth_for first.
func Alerts(c Config) File {
	all := []Rule{
		c.withConsole(c.alert(AlertDLQIngestion, "critical",
			// By queue alone: the exporter's alerter posts the same alert,
			// and it cannot know the instance label Prometheus gives it.
			fmt.Sprintf("sum by (queue) (rate(%s[%s])) > %v", c.sel("backstop_dlq_ingested_total"), c.DLQRateWindow, c.DLQPagePerSecond),
			c.DLQPageFor,
			"Jobs are being dead-lettered on queue {{ $labels.queue }}.",
			"Queue {{ $labels.queue }} has been dead-lettering {{ $value | humanize }} jobs/s for "+c.DLQPageFor+": work is failing for good. Find the reasons with `backstop dlq inspect --queue {{ $labels.queue }}`.")),
		c.withConsole(c.alert("BackstopDeadLetter", "warning",
			fmt.Sprintf("sum by (instance, queue) (increase(%s[10m])) > 0", c.sel("backstop_dlq_ingested_total")),
			c.DeadLetterFor,
			"New dead letters on queue {{ $labels.queue }}.",
			"Queue {{ $labels.queue }} dead-lettered {{ $value | humanize }} jobs in the last 10 minutes. Their reasons and job types: `backstop dlq inspect --queue {{ $labels.queue }}`, and the dashboard's dead letters by reason and by job type; once fixed, `backstop dlq replay --queue {{ $labels.queue }}` (--reason, --type) moves them back.")),
		// BackstopDeadLetter resolves 10 minutes after the last new dead
		// letter, whether or not anybody replayed or deleted it: this one
		// stays while the DLQ holds them.
		c.withConsole(c.alert("BackstopDLQDepth", "warning",
			fmt.Sprintf("max by (instance, queue) (%s) > %v", c.sel("backstop_dlq_size"), c.DLQDepthThreshold),
			c.DLQDepthFor,
			"The DLQ of queue {{ $labels.queue }} is not being drained.",
			"The DLQ of queue {{ $labels.queue }} has held more than "+fmt.Sprint(c.DLQDepthThreshold)+" dead letters for "+c.DLQDepthFor+" ({{ $value | humanize }} now): jobs that will not run unless somebody replays them, and BackstopDeadLetter resolved 10 minutes after the last new one. See them with `backstop dlq inspect --queue {{ $labels.queue }}`; replay what can now succeed and delete the rest.")),
		c.alert("BackstopHighRetryRate", "warning",
			fmt.Sprintf("queue:backstop_retry_rate:ratio_rate5m > %v", c.RetryRatioWarning),
			c.RetryRatioFor,
			"Retries are a large share of the work on queue {{ $labels.queue }}.",
			"{{ $value | humanizePercentage }} of attempt outcomes on queue {{ $labels.queue }} are retries (threshold "+fmt.Sprint(c.RetryRatioWarning)+")."),
		// The per-type variants name the failing type; untyped jobs
		// (job_type="") are the queue alerts' alone.
		c.alert("BackstopJobTypeHighRetryRate", "warning",
			fmt.Sprintf(`queue_job_type:backstop_retry_rate:ratio_rate5m{job_type!=""} > %v`, c.RetryRatioWarning),
			c.RetryRatioFor,
			"{{ $labels.job_type }} jobs on queue {{ $labels.queue }} are retried a lot.",
			"{{ $value | humanizePercentage }} of the attempt outcomes of {{ $labels.job_type }} jobs on queue {{ $labels.queue }} are retries (threshold "+fmt.Sprint(c.RetryRatioWarning)+"): their dependency fails many first tries. Other types on the queue may be healthy: compare them on the dashboard (job_type)."),
		c.alert("BackstopJobTypesOverflow", "warning",
			fmt.Sprintf("sum by (instance, queue) (increase(%s[10m])) > 0", c.sel("backstop_job_types_overflow_total")),
			"",
			"Queue {{ $labels.queue }} has more job types than it counts by name.",
			"{{ $value | humanize }} events of queue {{ $labels.queue }} in the last 10 minutes were of job types its registry is too full to name (types:limit, default 50): they are counted as job_type=\"other\", and a failing type among them is hidden there. Raise the limit with `backstop queue types --queue {{ $labels.queue }} --limit N`, or stop passing unbounded values (ids, messages) as job types."),
		c.alert("BackstopDelayedQueueStalled", "critical",
			fmt.Sprintf("max by (instance, queue) (%s) > %v\nand\nmax by (instance, queue) (%s) > 0",
				c.sel("backstop_delayed_oldest_overdue_seconds"), c.OverdueSeconds, c.sel("backstop_delayed_overdue_jobs")),
			c.OverdueFor,
			"Delayed jobs on queue {{ $labels.queue }} are not being promoted.",
			"The oldest due retry on queue {{ $labels.queue }} has been waiting {{ $value | humanizeDuration }} past its due time: the promote loop (the scheduler) is down or stuck."),
		c.alert("BackstopDelayedQueueGrowing", "warning",
			fmt.Sprintf("max by (instance, queue) (%s) > %v\nand\nmax by (instance, queue) (deriv(%s[%s])) > 0",
				c.sel("backstop_delayed_queue_size"), c.DelayedGrowthJobs, c.sel("backstop_delayed_queue_size"), c.DelayedGrowthWindow),
			c.DelayedGrowthFor,
			"Delayed retries pile up on queue {{ $labels.queue }}.",
			"{{ $value | humanize }} jobs of queue {{ $labels.queue }} wait in the delayed set for a retry (more than "+fmt.Sprint(c.DelayedGrowthJobs)+"), and the set has grown over "+c.DelayedGrowthWindow+" for "+c.DelayedGrowthFor+": jobs fail and are rescheduled faster than their retries come due, so a dependency has been failing for hours. They will reach the DLQ when their policy gives up."),
		c.alert("BackstopCrashLoop", "warning",
			fmt.Sprintf("sum by (instance, queue, group) (%s)\n-\nsum by (instance, queue, group) (%s)\n> 0",
				// le="3" in the text format, le="3.0" in OpenMetrics as
				// Prometheus 2 stores it (Prometheus 3 normalises it to "3").
				c.sel("backstop_stream_pending_deliveries_bucket", `le="+Inf"`), c.sel("backstop_stream_pending_deliveries_bucket", fmt.Sprintf(`le=~"%d(\\.0)?"`, c.CrashLoopDeliveries))),
			c.CrashLoopFor,
			"Pending jobs on queue {{ $labels.queue }} are being delivered again and again.",
			"{{ $value | humanize }} pending entries of queue {{ $labels.queue }}, group {{ $labels.group }}, were delivered more than "+fmt.Sprint(c.CrashLoopDeliveries)+" times without an outcome: workers crash on them. They reach the DLQ as crash_loop at the reclaim limit."),
		c.alert("BackstopCrashLoopNotDeadLettered", "warning",
			fmt.Sprintf("sum by (instance, queue) (increase(%s[10m])) > 0", c.sel("backstop_reclaim_skipped_total")),
			"",
			"Crash loops on queue {{ $labels.queue }} cannot be dead-lettered.",
			"Reclaim skipped crash loops of queue {{ $labels.queue }} {{ $value | humanize }} times in the last 10 minutes: the DLQ refused them (a key of the wrong type, an entry too large for it, Redis out of memory). They stay pending, neither run nor dead-lettered, until the DLQ takes them."),
		c.alert("BackstopStreamLagGrowing", "warning",
			fmt.Sprintf("max by (instance, queue, group) (%s) > %v\nand\nmax by (instance, queue, group) (deriv(%s[10m])) > 0",
				c.sel("backstop_stream_lag_jobs"), c.LagJobsWarning, c.sel("backstop_stream_lag_jobs")),
			c.LagFor,
			"Consumers of queue {{ $labels.queue }} are falling behind.",
			"{{ $value | humanize }} jobs of queue {{ $labels.queue }} wait for group {{ $labels.group }}, and the backlog grows."),
		c.alert("BackstopOldestJobTooOld", "critical",
			fmt.Sprintf("max by (instance, queue) (%s) > %v", c.sel("backstop_oldest_job_age_seconds"), c.OldestJobSeconds),
			c.OldestJobFor,
			"The oldest job on queue {{ $labels.queue }} has waited too long.",
			"A job of queue {{ $labels.queue }} enqueued {{ $value | humanizeDuration }} ago has not finished (bound "+fmt.Sprint(c.OldestJobSeconds)+" s): the queue is stuck or its consumers are gone, even if nothing fails."),
		c.alert("BackstopAttemptsTailHeavy", "warning",
			fmt.Sprintf("(\n  sum by (instance, queue) (rate(%[1]s[%[3]s]))\n-\n  sum by (instance, queue) (rate(%[2]s[%[3]s]))\n)\n/\nsum by (instance, queue) (rate(%[1]s[%[3]s]))\n> %[4]v",
				// le="3" in the text format, le="3.0" in OpenMetrics as
				// Prometheus 2 stores it.
				c.sel("backstop_job_attempts_count"), c.sel("backstop_job_attempts_bucket", fmt.Sprintf(`le=~"%d(\\.0)?"`, c.TailAttempts)), c.TailWindow, c.TailRatio),
			c.TailFor,
			"Most jobs on queue {{ $labels.queue }} need many attempts.",
			"{{ $value | humanizePercentage }} of the jobs queue {{ $labels.queue }} finished over "+c.TailWindow+" needed more than "+fmt.Sprint(c.TailAttempts)+" attempts (threshold "+fmt.Sprint(c.TailRatio)+"): the dependency fails most first tries, and the retries hide it."),
		c.alert("BackstopClientHighRetryRatio", "warning",
			fmt.Sprintf("policy_target:backstop_client_retry_ratio:ratio_rate5m > %v", c.ClientRetryRatioWarning),
			c.ClientRetryRatioFor,
			"Calls to {{ $labels.target }} under policy {{ $labels.policy }} are often retried.",
			"{{ $value | humanizePercentage }} of the calls services make to {{ $labels.target }} under policy {{ $labels.policy }} are retries (threshold "+fmt.Sprint(c.ClientRetryRatioWarning)+"): the dependency fails many first tries, and the retries hide it."),
		c.alert("BackstopClientRetryLatencyHigh", "warning",
			fmt.Sprintf("policy_target:backstop_client_retry_latency_seconds:p99_rate5m\n>\npolicy_target:backstop_client_retry_delay_seconds:p99_rate5m + %v", c.RetryLatencyMarginSeconds),
			c.RetryLatencyFor,
			"Retries of {{ $labels.target }} (policy {{ $labels.policy }}) start late.",
			"The p99 of the measured time from a failure to the next attempt's start is {{ $value | humanizeDuration }} for {{ $labels.target }} under policy {{ $labels.policy }}, more than "+fmt.Sprint(c.RetryLatencyMarginSeconds)+" s above the p99 delay the policy decided: a stalled promoter (Redis) or delay mover (RabbitMQ), or workers too busy to take due retries."),
		c.alert("BackstopClientCircuitStuckOpen", "critical",
			fmt.Sprintf("max by (policy, target) (max_over_time(%s[%s])) == 0",
				c.csel("backstop_client_circuit_state", `state="closed"`), c.CircuitStuckWindow),
			c.CircuitStuckFor,
			"The circuit breaker for {{ $labels.target }} (policy {{ $labels.policy }}) stays open.",
			"No process has seen the breaker of policy {{ $labels.policy }} for {{ $labels.target }} closed for "+c.CircuitStuckWindow+": its trial calls keep failing, and calls to {{ $labels.target }} are refused before they leave."),
		c.alert("BackstopClientCallsRefused", "warning",
			fmt.Sprintf("sum by (policy, target, reason) (increase(%s[10m])) > 0", c.csel("backstop_client_calls_refused_total")),
			"",
			"Calls to {{ $labels.target }} are refused ({{ $labels.reason }}).",
			"Processes refused {{ $value | humanize }} calls to {{ $labels.target }} under policy {{ $labels.policy }} in the last 10 minutes before making them ({{ $labels.reason }}): the breaker is open, so callers get an error at once and queues defer their jobs."),
		// A store that cannot be reached refuses keyed requests (fail
		// closed, the default) or lets duplicates through (fail open):
		// either way users see it, so it pages.
		c.alert("BackstopIdempotencyStoreErrors", "critical",
			fmt.Sprintf("sum by (job, instance, operation) (increase(%s[5m])) > 0", c.csel("backstop_idempotency_store_errors_total")),
			c.IdempotencyStoreErrorsFor,
			"The idempotency store of {{ $labels.job }} on {{ $labels.instance }} fails ({{ $labels.operation }}).",
			"{{ $value | humanize }} idempotency store calls ({{ $labels.operation }}) of {{ $labels.job }} on {{ $labels.instance }} failed in the last 5 minutes: its Redis is unreachable or refuses the script. Keyed requests are refused (fail closed, the default) or run without protection against duplicates (fail open)."),
		// Named for the source, not the broker: one exporter reads Redis
		// or RabbitMQ (BackstopRedisDown before issue 42).
		c.alert("BackstopSourceDown", "critical",
			fmt.Sprintf("max by (instance) (%s) == 0", c.sel("backstop_up")),
			c.DownFor,
			"backstop-exporter {{ $labels.instance }} cannot read its Redis or RabbitMQ.",
			"backstop-exporter {{ $labels.instance }} reports backstop_up 0: the Redis or RabbitMQ it watches is down, unreachable or refuses its credentials, so none of its queues is watched (its log says which and why: `scrape failed`)."),
		c.alert("BackstopRedisRejectingWrites", "critical",
			fmt.Sprintf("sum by (instance, node, reason) (increase(%s[5m])) > 0", c.sel("backstop_redis_rejected_writes_total")),
			c.RejectedWritesFor,
			"Redis node {{ $labels.node }} refuses writes ({{ $labels.reason }}).",
			"Redis node {{ $labels.node }} refused {{ $value | humanize }} writes in the last 5 minutes with {{ $labels.reason }}: acks, retries and dead letters fail, so jobs that finished stay pending and run again. oom: used memory is at maxmemory under noeviction; misconf: RDB snapshots fail; readonly: clients write to a replica; noreplicas: fewer replicas than min-replicas-to-write."),
		c.alert("BackstopRedisEvictingKeys", "critical",
			fmt.Sprintf("sum by (instance, node) (increase(%s[5m])) > 0", c.sel("backstop_redis_evicted_keys_total")),
			"",
			"Redis node {{ $labels.node }} evicts keys.",
			"Redis node {{ $labels.node }} evicted {{ $value | humanize }} keys in the last 5 minutes to stay under maxmemory: an evicted queue key is jobs, delayed retries or dead letters lost. Queues need maxmemory-policy noeviction."),
		c.alert("BackstopRedisMemoryHigh", "warning",
			fmt.Sprintf("max by (instance, node) (%s / (%s > 0)) > %v",
				c.sel("backstop_redis_memory_used_bytes"), c.sel("backstop_redis_memory_max_bytes"), c.MemoryRatioWarning),
			c.MemoryFor,
			"Redis node {{ $labels.node }} is near its memory limit.",
			"Redis node {{ $labels.node }} uses {{ $value | humanizePercentage }} of its maxmemory: at the limit it refuses writes (noeviction) or evicts keys (any other policy)."),
		c.alert("BackstopExporterLimitReached", "warning",
			fmt.Sprintf("max by (instance, limit) (%s) == 1", c.sel("backstop_scrape_limit_reached", `limit=~"max_keys|stats_labels|job_types|timeout"`)),
			c.LimitFor,
			"backstop-exporter {{ $labels.instance }} hits its {{ $labels.limit }} bound.",
			"backstop-exporter {{ $labels.instance }} has hit its {{ $labels.limit }} bound on every scrape for "+c.LimitFor+", so some metrics are missing. max_keys: queues matching --queues.pattern are not read; timeout: scrapes run out of --scrape.timeout; stats_labels: a stats hash holds more reasons than are reported; job_types: a stats hash holds more job types than are reported by name (the rest are counted as other)."),
		c.alert("BackstopExporterAbsent", "critical",
			fmt.Sprintf("absent(%s)", c.sel("backstop_up")),
			c.DownFor,
			"backstop-exporter is gone.",
			"No backstop-exporter has been scraped for "+c.DownFor+": queues are not watched."),
	}
	var rules []Rule
	for _, r := range all {
		if !slices.Contains(c.Disabled, r.Alert) {
			rules = append(rules, r)
		}
	}
	return File{Groups: []Group{{Name: "backstop.alerts", Rules: rules}}}
}

// Marshal renders a rule file as YAML with a generated-file header.
func Marshal(f File) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("# Generated by `backstop rules generate` (package rules). Do not edit.\n")
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(f); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Files returns the rule files by name.
func Files(c Config) (map[string][]byte, error) {
	out := map[string][]byte{}
	for name, f := range map[string]File{"backstop.rules.yml": Recording(c), "backstop.alerts.yml": Alerts(c)} {
		b, err := Marshal(f)
		if err != nil {
			return nil, err
		}
		out[name] = b
	}
	return out, nil
}
