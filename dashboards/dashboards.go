// Package dashboards generates backstop's Grafana dashboards from code: an
// overview of every queue and a per-queue drill-down. The shipped
// dashboards/*.json are its output; tests keep them in sync and check them
// (variables, units, descriptions, $__rate_interval, every counter inside
// rate or increase, every metric emitted by the exporter).
package dashboards

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Dashboard is the part of Grafana's dashboard model backstop uses.
type Dashboard struct {
	UID           string     `json:"uid"`
	Title         string     `json:"title"`
	Description   string     `json:"description"`
	Tags          []string   `json:"tags"`
	Timezone      string     `json:"timezone"`
	SchemaVersion int        `json:"schemaVersion"`
	Refresh       string     `json:"refresh"`
	Time          TimeRange  `json:"time"`
	Templating    Templating `json:"templating"`
	Links         []Link     `json:"links"`
	Panels        []Panel    `json:"panels"`
}

type TimeRange struct {
	From string `json:"from"`
	To   string `json:"to"`
}

type Templating struct {
	List []Variable `json:"list"`
}

// Variable is a dashboard variable.
type Variable struct {
	Name       string      `json:"name"`
	Label      string      `json:"label"`
	Type       string      `json:"type"`
	Query      string      `json:"query"`
	Datasource *Datasource `json:"datasource,omitempty"`
	Refresh    int         `json:"refresh,omitempty"`
	Multi      bool        `json:"multi"`
	IncludeAll bool        `json:"includeAll"`
	AllValue   string      `json:"allValue,omitempty"`
	Sort       int         `json:"sort,omitempty"`
}

type Datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type Link struct {
	Title       string   `json:"title"`
	Type        string   `json:"type"`
	Tags        []string `json:"tags"`
	AsDropdown  bool     `json:"asDropdown"`
	IncludeVars bool     `json:"includeVars"`
	KeepTime    bool     `json:"keepTime"`
}

// Panel is a Grafana panel with Prometheus targets.
type Panel struct {
	ID          int         `json:"id"`
	Type        string      `json:"type"`
	Title       string      `json:"title"`
	Description string      `json:"description"`
	Datasource  Datasource  `json:"datasource"`
	GridPos     GridPos     `json:"gridPos"`
	Targets     []Target    `json:"targets"`
	FieldConfig FieldConfig `json:"fieldConfig"`
	Options     any         `json:"options,omitempty"`
}

type GridPos struct {
	H int `json:"h"`
	W int `json:"w"`
	X int `json:"x"`
	Y int `json:"y"`
}

type Target struct {
	RefID        string     `json:"refId"`
	Expr         string     `json:"expr"`
	LegendFormat string     `json:"legendFormat"`
	Format       string     `json:"format,omitempty"`
	Datasource   Datasource `json:"datasource"`
}

type FieldConfig struct {
	Defaults FieldDefaults `json:"defaults"`
}

type FieldDefaults struct {
	Unit string `json:"unit"`
	Min  *int   `json:"min,omitempty"`
}

var ds = Datasource{Type: "prometheus", UID: "${datasource}"}

// sel is the selector every panel query carries.
const sel = `job=~"$job", instance=~"$instance", queue=~"$queue"`

// hostSel is for the exporter's own metrics, which have no queue label.
const hostSel = `job=~"$job", instance=~"$instance"`

func variables() Templating {
	return Templating{List: []Variable{
		{Name: "datasource", Label: "Data source", Type: "datasource", Query: "prometheus"},
		// The exporter's jobs, and the services' that export backstop_client_*
		// or backstop_idempotency_*.
		{Name: "job", Label: "job", Type: "query", Datasource: &ds, Refresh: 2, Sort: 1,
			Query: `label_values({__name__=~"backstop_up|backstop_client_attempts_total|backstop_idempotency_requests_total"}, job)`, Multi: true, IncludeAll: true, AllValue: ".+"},
		{Name: "instance", Label: "instance", Type: "query", Datasource: &ds, Refresh: 2, Sort: 1,
			Query: `label_values({__name__=~"backstop_up|backstop_client_attempts_total|backstop_idempotency_requests_total", job=~"$job"}, instance)`, Multi: true, IncludeAll: true, AllValue: ".+"},
		{Name: "queue", Label: "queue", Type: "query", Datasource: &ds, Refresh: 2, Sort: 1,
			Query: `label_values(backstop_dlq_size{job=~"$job", instance=~"$instance"}, queue)`, Multi: true, IncludeAll: true, AllValue: ".+"},
	}}
}

// layout places panels two per row, 12 wide and 8 high.
func layout(ps []Panel) []Panel {
	for i := range ps {
		ps[i].ID = i + 1
		ps[i].Datasource = ds
		ps[i].GridPos = GridPos{H: 8, W: 12, X: (i % 2) * 12, Y: (i / 2) * 8}
		for j := range ps[i].Targets {
			ps[i].Targets[j].RefID = string(rune('A' + j))
			ps[i].Targets[j].Datasource = ds
		}
	}
	return ps
}

func ts(title, desc, unit string, targets ...Target) Panel {
	zero := 0
	return Panel{Type: "timeseries", Title: title, Description: desc, Targets: targets,
		FieldConfig: FieldConfig{Defaults: FieldDefaults{Unit: unit, Min: &zero}}}
}

func q(expr, legend string) Target { return Target{Expr: expr, LegendFormat: legend} }

func links() []Link {
	return []Link{{Title: "backstop", Type: "dashboards", Tags: []string{"backstop"}, AsDropdown: true, IncludeVars: true, KeepTime: true}}
}

// Overview is the dashboard of every queue.
func Overview() Dashboard {
	return Dashboard{
		UID: "backstop-overview", Title: "backstop overview",
		Description: "Every queue's dead letters, retries and backlog, and the exporter's health.",
		Tags:        []string{"backstop"}, Timezone: "browser", SchemaVersion: 39, Refresh: "30s",
		Time: TimeRange{"now-6h", "now"}, Templating: variables(), Links: links(),
		Panels: layout([]Panel{
			ts("DLQ ingestion", "Jobs dead-lettered per second, by queue (XINFO STREAM entries-added: survives trimming). What BackstopDLQIngestion pages on.", "ops",
				q(fmt.Sprintf("sum by (queue) (rate(backstop_dlq_ingested_total{%s}[$__rate_interval]))", sel), "{{queue}}")),
			ts("Retry rate", "Share of the attempts made that were retries, by queue (deferrals, which spend no attempt, are left out: as the rules compute it).", "percentunit",
				q(fmt.Sprintf("sum by (queue) (rate(backstop_attempts_total{%s, outcome=\"retry\"}[$__rate_interval]))\n/\nsum by (queue) (rate(backstop_attempts_total{%s, outcome!=\"deferred\"}[$__rate_interval]))", sel, sel), "{{queue}}")),
			ts("Max attempts reached", "Jobs per second that failed on every attempt the policy allowed, by queue.", "ops",
				q(fmt.Sprintf("sum by (queue) (rate(backstop_max_attempts_reached_total{%s}[$__rate_interval]))", sel), "{{queue}}")),
			ts("Delayed retries", "Jobs waiting in the delayed set (cold retries), and how many of them are already due.", "short",
				q(fmt.Sprintf("sum by (queue) (backstop_delayed_queue_size{%s})", sel), "{{queue}} delayed"),
				q(fmt.Sprintf("sum by (queue) (backstop_delayed_overdue_jobs{%s})", sel), "{{queue}} overdue")),
			ts("Oldest overdue retry", "How long the oldest due retry has waited past its due time: it grows when the promote loop (the scheduler) is down.", "s",
				q(fmt.Sprintf("max by (queue) (backstop_delayed_oldest_overdue_seconds{%s})", sel), "{{queue}}")),
			ts("Oldest job age", "Age of the oldest job not finished yet (the jobs stream's first entry or the delayed set's next member, from first_enqueued_ms): it grows while a queue is stuck, even when nothing fails. What BackstopOldestJobTooOld pages on.", "s",
				q(fmt.Sprintf("max by (queue) (backstop_oldest_job_age_seconds{%s})", sel), "{{queue}}")),
			ts("Stream lag", "Jobs not yet delivered to each consumer group (left out when Redis cannot tell).", "short",
				q(fmt.Sprintf("sum by (queue, group) (backstop_stream_lag_jobs{%s})", sel), "{{queue}} / {{group}}")),
			ts("Exporter: Redis up", "1 when the exporter could read Redis on its last scrape.", "short",
				q(fmt.Sprintf("min by (instance) (backstop_up{%s})", hostSel), "{{instance}}")),
			ts("Exporter: scrape duration and errors", "Time one collection takes, and collection errors per second by kind.", "s",
				q(fmt.Sprintf("max by (instance) (backstop_scrape_duration_seconds{%s})", hostSel), "{{instance}} duration"),
				q(fmt.Sprintf("sum by (instance) (rate(backstop_scrape_errors_total{%s}[$__rate_interval]))", hostSel), "{{instance}} errors/s")),
		}),
	}
}

// csel selects the process metrics (backstop_client_*): services export
// them under their own jobs, which the job variable lists beside the
// exporter's.
const csel = `job=~"$job", instance=~"$instance", policy=~"$policy", target=~"$target"`

// clientVariables pick the policy and target of the process metrics.
func clientVariables() []Variable {
	return []Variable{
		{Name: "policy", Label: "policy", Type: "query", Datasource: &ds, Refresh: 2, Sort: 1,
			Query: `label_values(backstop_client_attempts_total{job=~"$job", instance=~"$instance"}, policy)`, Multi: true, IncludeAll: true, AllValue: ".+"},
		{Name: "target", Label: "target", Type: "query", Datasource: &ds, Refresh: 2, Sort: 1,
			Query: `label_values(backstop_client_attempts_total{job=~"$job", instance=~"$instance", policy=~"$policy"}, target)`, Multi: true, IncludeAll: true, AllValue: ".+"},
	}
}

// row returns a row titled title, with ID firstID at y, and its panels
// laid out below it.
func row(firstID, y int, title, desc string, ps []Panel) []Panel {
	ps = layout(ps)
	for i := range ps {
		ps[i].ID = firstID + 1 + i
		ps[i].GridPos.Y += y + 1
	}
	r := Panel{ID: firstID, Type: "row", Title: title, Description: desc, Datasource: ds, GridPos: GridPos{H: 1, W: 24, X: 0, Y: y}}
	return append([]Panel{r}, ps...)
}

// jtsel selects one queue's series of the chosen job types. Untyped jobs
// have job_type="": the All value ".*" keeps them.
const jtsel = sel + `, job_type=~"$job_type"`

// untyped names the series of untyped jobs (job_type="") in legends.
func untyped(expr string) string {
	return fmt.Sprintf(`label_replace(%s, "job_type", "(untyped)", "job_type", "")`, expr)
}

// jobTypeRow is the row of per-type figures (issue 16: which kind of job
// on a shared queue retries, dead-letters, needs many attempts), placed
// below the panels that end at y.
func jobTypeRow(firstID, y int) []Panel {
	return row(firstID, y, "Job types",
		"The queue's figures by job type (job_type; untyped jobs have none), for queues shared by several kinds of job.", []Panel{
			ts("Retry rate by job type", "Share of each job type's attempt outcomes that were retries. What BackstopJobTypeHighRetryRate warns on.", "percentunit",
				q(untyped(fmt.Sprintf("sum by (queue, job_type) (rate(backstop_attempts_total{%s, outcome=\"retry\"}[$__rate_interval]))\n/\nsum by (queue, job_type) (rate(backstop_attempts_total{%s, outcome!=\"deferred\"}[$__rate_interval]))", jtsel, jtsel)), "{{queue}} {{job_type}}")),
			ts("Attempt outcomes by job type", "Attempt outcomes per second by job type: success, retry, dead letter, deferred.", "ops",
				q(untyped(fmt.Sprintf("sum by (queue, job_type, outcome) (rate(backstop_attempts_total{%s}[$__rate_interval]))", jtsel)), "{{queue}} {{job_type}} {{outcome}}")),
			ts("Retries by job type and reason", "Retries per second by job type and the policy's reason (transient, uncertain, retry_after).", "ops",
				q(untyped(fmt.Sprintf("sum by (queue, job_type, reason) (rate(backstop_retries_total{%s}[$__rate_interval]))", jtsel)), "{{queue}} {{job_type}} {{reason}}")),
			ts("Dead letters by job type", "Jobs dead-lettered per second by job type and reason: which kind of job fills the DLQ. What BackstopDeadLetter warns on, per queue; `backstop dlq replay --type` moves one type back.", "ops",
				q(untyped(fmt.Sprintf("sum by (queue, job_type, reason) (rate(backstop_dead_letters_total{%s}[$__rate_interval]))", jtsel)), "{{queue}} {{job_type}} {{reason}}")),
			ts("Attempts per job by job type", "The attempt on which each type's jobs finished (success or dead letter): median and 90th percentile. A healthy type sits on 1.", "short",
				q(untyped(fmt.Sprintf("histogram_quantile(0.5, sum by (queue, job_type, le) (rate(backstop_job_attempts_bucket{%s}[$__rate_interval])))", jtsel)), "{{queue}} {{job_type}} p50"),
				q(untyped(fmt.Sprintf("histogram_quantile(0.9, sum by (queue, job_type, le) (rate(backstop_job_attempts_bucket{%s}[$__rate_interval])))", jtsel)), "{{queue}} {{job_type}} p90")),
			ts("Job type registry", "Job types the queue counts by name, and events per second of types counted as other because the registry is full (types:limit). What BackstopJobTypesOverflow warns on.", "short",
				q(fmt.Sprintf("sum by (queue) (backstop_job_types{%s})", sel), "{{queue}} types"),
				q(fmt.Sprintf("sum by (queue) (rate(backstop_job_types_overflow_total{%s}[$__rate_interval]))", sel), "{{queue}} overflow/s")),
		})
}

// clientRow is the row of in-process retries (retry loops and queue
// workers in Go, Node and Python), placed below the panels that end at y.
func clientRow(firstID, y int) []Panel {
	return row(firstID, y, "In-process retries",
		"backstop_client_* from services' retry loops and queue workers (Go, Node, Python), by policy and target.", []Panel{
			ts("In-process attempts", "Calls made under a policy by services' retry loops and queue workers, per second, by outcome: success, retry, dead_letter, and refused (stopped by the breaker before leaving).", "ops",
				q(fmt.Sprintf("sum by (policy, target, outcome) (rate(backstop_client_attempts_total{%s}[$__rate_interval]))", csel), "{{policy}} → {{target}} {{outcome}}")),
			ts("In-process retry ratio", "Share of the calls made that were retries, by policy and target. What BackstopClientHighRetryRatio warns on.", "percentunit",
				q(fmt.Sprintf("sum by (policy, target) (rate(backstop_client_attempts_total{%s, outcome=\"retry\"}[$__rate_interval]))\n/\nsum by (policy, target) (rate(backstop_client_attempts_total{%s, outcome!=\"refused\"}[$__rate_interval]))", csel, csel), "{{policy}} → {{target}}")),
			ts("In-process retries by reason", "transient, uncertain, retry_after (the server set the wait).", "ops",
				q(fmt.Sprintf("sum by (policy, target, reason) (rate(backstop_client_retries_total{%s}[$__rate_interval]))", csel), "{{policy}} → {{target}} {{reason}}")),
			ts("Retry delay", "The delay scheduled before a retry (between attempt N and N+1): median and 90th percentile.", "s",
				q(fmt.Sprintf("histogram_quantile(0.5, sum by (policy, target, le) (rate(backstop_client_retry_delay_seconds_bucket{%s}[$__rate_interval])))", csel), "{{policy}} → {{target}} p50"),
				q(fmt.Sprintf("histogram_quantile(0.9, sum by (policy, target, le) (rate(backstop_client_retry_delay_seconds_bucket{%s}[$__rate_interval])))", csel), "{{policy}} → {{target}} p90")),
			ts("Retry latency", "Measured time from a failure to the next attempt's start (a queue worker measures it as the retried job starts), p99, beside the p99 delay the policy decided. Measured far above decided: a stalled promoter or mover, or busy workers. What BackstopClientRetryLatencyHigh warns on.", "s",
				q(fmt.Sprintf("histogram_quantile(0.99, sum by (policy, target, le) (rate(backstop_client_retry_latency_seconds_bucket{%s}[$__rate_interval])))", csel), "{{policy}} → {{target}} measured p99"),
				q(fmt.Sprintf("histogram_quantile(0.99, sum by (policy, target, le) (rate(backstop_client_retry_delay_seconds_bucket{%s}[$__rate_interval])))", csel), "{{policy}} → {{target}} decided p99")),
			ts("Calls refused", "Calls the breaker refused before they were made, per second, by reason. What BackstopClientCallsRefused warns on.", "ops",
				q(fmt.Sprintf("sum by (policy, target, reason) (rate(backstop_client_calls_refused_total{%s}[$__rate_interval]))", csel), "{{policy}} → {{target}} {{reason}}")),
			ts("Breaker state", "Processes whose breaker is in each state (closed, open, half_open), and state changes per second. A breaker never seen closed is what BackstopClientCircuitStuckOpen pages on.", "short",
				q(fmt.Sprintf("sum by (policy, target, state) (backstop_client_circuit_state{%s})", csel), "{{policy}} → {{target}} {{state}}"),
				q(fmt.Sprintf("sum by (policy, target, to) (rate(backstop_client_circuit_transitions_total{%s}[$__rate_interval]))", csel), "{{policy}} → {{target}} to {{to}}/s")),
		})
}

// idempotencyRow is the row of idempotency stores (backstop_idempotency_*
// from services' middleware and workers), placed below the panels that end
// at y. Its series have no queue label: they follow $job and $instance.
func idempotencyRow(firstID, y int) []Panel {
	return row(firstID, y, "Idempotency",
		"backstop_idempotency_* from services' idempotency middleware and workers (Go, Node, Python), by job and instance.", []Panel{
			ts("Idempotent requests", "Requests and jobs carrying an idempotency key, per second, by outcome: first_run, replayed (a duplicate answered from the store instead of running again), in_progress (409), conflict (422: same key, different request), too_large.", "ops",
				q(fmt.Sprintf("sum by (job, outcome) (rate(backstop_idempotency_requests_total{%s}[$__rate_interval]))", hostSel), "{{job}} {{outcome}}")),
			ts("Idempotency store errors", "Failed Redis calls of the store per second, by operation (begin, complete, fail). What BackstopIdempotencyStoreErrors pages on.", "ops",
				q(fmt.Sprintf("sum by (job, instance, operation) (rate(backstop_idempotency_store_errors_total{%s}[$__rate_interval]))", hostSel), "{{job}} {{instance}} {{operation}}")),
			ts("Idempotency leases", "Keys taken over because their owner's lease ran out (a crashed or slow request), and owners that found their key taken when they finished (their result was not stored).", "ops",
				q(fmt.Sprintf("sum by (job) (rate(backstop_idempotency_lease_expiries_total{%s}[$__rate_interval]))", hostSel), "{{job}} expired"),
				q(fmt.Sprintf("sum by (job) (rate(backstop_idempotency_lease_lost_total{%s}[$__rate_interval]))", hostSel), "{{job}} lost")),
		})
}

// Queue is the drill-down of one (or a few) queues: $queue is a
// multi-select, and every panel but the attempt heatmap shows each
// selected queue as its own series (by (queue), legend {{queue}}), never
// their sum. Alerts link here with their queue selected (var-queue).
func Queue() Dashboard {
	d := Dashboard{
		UID: "backstop-queue", Title: "backstop queue",
		Description: "One queue in detail: how many attempts jobs take, why they are retried and dead-lettered, redeliveries.",
		Tags:        []string{"backstop"}, Timezone: "browser", SchemaVersion: 39, Refresh: "30s",
		Time: TimeRange{"now-6h", "now"}, Templating: variables(), Links: links(),
		Panels: layout([]Panel{
			{Type: "heatmap", Title: "Attempt distribution",
				Description: "The attempt on which jobs finished (success or dead letter), per interval, the selected queues together (the panels below show each queue): a healthy queue sits on attempt 1.",
				Targets:     []Target{{Expr: fmt.Sprintf("sum by (le) (rate(backstop_job_attempts_bucket{%s}[$__rate_interval]))", sel), LegendFormat: "{{le}}", Format: "heatmap"}},
				FieldConfig: FieldConfig{Defaults: FieldDefaults{Unit: "short"}},
				Options:     map[string]any{"calculate": false, "yAxis": map[string]any{"unit": "short"}}},
			ts("Attempt outcomes", "Attempt outcomes per second: success, retry, dead letter.", "ops",
				q(fmt.Sprintf("sum by (queue, outcome) (rate(backstop_attempts_total{%s}[$__rate_interval]))", sel), "{{queue}} {{outcome}}")),
			ts("Retries by reason", "transient, uncertain (HTTP 500 and the like), retry_after (the server set the wait).", "ops",
				q(fmt.Sprintf("sum by (queue, reason) (rate(backstop_retries_total{%s}[$__rate_interval]))", sel), "{{queue}} {{reason}}")),
			ts("Dead letters by reason", "Why jobs were given up: permanent_error, max_attempts_reached, not_idempotent, crash_loop, unroutable…", "ops",
				q(fmt.Sprintf("sum by (queue, reason) (rate(backstop_dead_letters_total{%s}[$__rate_interval]))", sel), "{{queue}} {{reason}}")),
			ts("Retry-After share", "Share of retries whose wait the server set (Retry-After or grpc-retry-pushback-ms): throttling.", "percentunit",
				q(fmt.Sprintf("sum by (queue) (rate(backstop_retries_total{%s, reason=\"retry_after\"}[$__rate_interval]))\n/\nsum by (queue) (rate(backstop_retries_total{%s}[$__rate_interval]))", sel, sel), "{{queue}}")),
			ts("Pending deliveries", "Pending entries (from a bounded sample) by how often they were delivered: high counts are crash loops before they reach the DLQ.", "short",
				q(fmt.Sprintf("sum by (queue, le) (backstop_stream_pending_deliveries_bucket{%s})", sel), "{{queue}} delivered <= {{le}}")),
			ts("Pending and lag", "Jobs delivered but not finished, and jobs not yet delivered.", "short",
				q(fmt.Sprintf("sum by (queue, group) (backstop_stream_pending_jobs{%s})", sel), "{{queue}} / {{group}} pending"),
				q(fmt.Sprintf("sum by (queue, group) (backstop_stream_lag_jobs{%s})", sel), "{{queue}} / {{group}} lag")),
			ts("Forced runs", "Delayed jobs an operator moved to the jobs stream before they were due (`backstop queue run`), per second.", "ops",
				q(fmt.Sprintf("sum by (queue) (rate(backstop_force_run_total{%s}[$__rate_interval]))", sel), "{{queue}}")),
			ts("Dead letter queue", "Dead letters waiting (XLEN): what `backstop dlq inspect` lists and `backstop dlq replay` moves back.", "short",
				q(fmt.Sprintf("sum by (queue) (backstop_dlq_size{%s})", sel), "{{queue}}")),
		}),
	}
	d.Templating.List = append(d.Templating.List, Variable{Name: "job_type", Label: "job type", Type: "query", Datasource: &ds, Refresh: 2, Sort: 1,
		Query: `label_values(backstop_attempts_total{job=~"$job", instance=~"$instance", queue=~"$queue"}, job_type)`, Multi: true, IncludeAll: true, AllValue: ".*"})
	d.Templating.List = append(d.Templating.List, clientVariables()...)
	last := d.Panels[len(d.Panels)-1].GridPos
	d.Panels = append(d.Panels, jobTypeRow(len(d.Panels)+1, last.Y+last.H)...)
	last = d.Panels[len(d.Panels)-1].GridPos
	d.Panels = append(d.Panels, clientRow(len(d.Panels)+1, last.Y+last.H)...)
	last = d.Panels[len(d.Panels)-1].GridPos
	d.Panels = append(d.Panels, idempotencyRow(len(d.Panels)+1, last.Y+last.H)...)
	return d
}

// All returns the dashboards by file name.
func All() map[string]Dashboard {
	return map[string]Dashboard{"backstop-overview.json": Overview(), "backstop-queue.json": Queue()}
}

// Marshal renders a dashboard as indented JSON.
func Marshal(d Dashboard) ([]byte, error) {
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Exprs returns every query of a dashboard, variables included, with
// Grafana's interval variables replaced so the PromQL parser reads them.
func Exprs(d Dashboard) []string {
	var out []string
	for _, p := range d.Panels {
		for _, t := range p.Targets {
			out = append(out, strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h").Replace(t.Expr))
		}
	}
	return out
}
