package dashboards_test

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"

	"github.com/backstop-dev/backstop/dashboards"
)

// The shipped JSON is the generator's output.
func TestShippedDashboardsAreGenerated(t *testing.T) {
	for name, d := range dashboards.All() {
		want, err := dashboards.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("dashboards/%s is not what `backstop dashboards generate` writes: run it and commit the result", name)
		}
	}
}

// The dashboard-linter conventions: a datasource variable, job, instance
// and queue variables, $__rate_interval, units and descriptions on every
// panel, every counter inside rate or increase, queries that parse.
func TestDashboardsFollowTheLinterConventions(t *testing.T) {
	p := parser.NewParser(parser.Options{})
	for name, d := range dashboards.All() {
		vars := map[string]bool{}
		for _, v := range d.Templating.List {
			vars[v.Name] = true
		}
		for _, v := range []string{"datasource", "job", "instance", "queue"} {
			if !vars[v] {
				t.Errorf("%s: no %s variable", name, v)
			}
		}
		for _, panel := range d.Panels {
			where := name + ": " + panel.Title
			if panel.Type == "row" {
				continue // a row holds panels; it shows no data
			}
			if panel.Description == "" || panel.FieldConfig.Defaults.Unit == "" {
				t.Errorf("%s: needs a description and a unit", where)
			}
			if panel.Datasource.UID != "${datasource}" {
				t.Errorf("%s: datasource %q, want ${datasource}", where, panel.Datasource.UID)
			}
			for _, tg := range panel.Targets {
				if strings.Contains(tg.Expr, "[") && !strings.Contains(tg.Expr, "[$__rate_interval]") {
					t.Errorf("%s: range without $__rate_interval: %s", where, tg.Expr)
				}
				if !strings.Contains(tg.Expr, `job=~"$job"`) || !strings.Contains(tg.Expr, `instance=~"$instance"`) {
					t.Errorf("%s: query ignores $job or $instance: %s", where, tg.Expr)
				}
				expr, err := p.ParseExpr(strings.ReplaceAll(tg.Expr, "$__rate_interval", "5m"))
				if err != nil {
					t.Errorf("%s: %v: %s", where, err, tg.Expr)
					continue
				}
				checkCounters(t, where, expr)
			}
		}
	}
}

// checkCounters fails for a _total (or histogram _bucket) series used
// outside rate or increase.
func checkCounters(t *testing.T, where string, e parser.Expr) {
	inRange := map[*parser.VectorSelector]bool{}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if c, ok := n.(*parser.Call); ok && (c.Func.Name == "rate" || c.Func.Name == "increase") {
			parser.Inspect(c, func(m parser.Node, _ []parser.Node) error {
				if vs, ok := m.(*parser.VectorSelector); ok {
					inRange[vs] = true
				}
				return nil
			})
		}
		return nil
	})
	counter := regexp.MustCompile(`(_total|_bucket)$`)
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		// A sample of pending entries is a gauge histogram: its buckets
		// go down as well as up, so it is read as is.
		if vs, ok := n.(*parser.VectorSelector); ok && counter.MatchString(vs.Name) && !inRange[vs] &&
			vs.Name != "backstop_stream_pending_deliveries_bucket" {
			t.Errorf("%s: counter %s outside rate/increase", where, vs.Name)
		}
		return nil
	})
}

// Issue 42: the queue dashboard's $queue is a multi-select, and each panel
// shows every selected queue as its own series (by queue, legend {{queue}})
// instead of summing them; the heatmap alone is of the queues together.
func TestQueueDashboardShowsEachQueue(t *testing.T) {
	d := dashboards.Queue()
	multi := false
	for _, v := range d.Templating.List {
		multi = multi || v.Name == "queue" && v.Multi
	}
	if !multi {
		t.Error("$queue is not a multi-select")
	}
	n := 0
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			if !strings.Contains(tg.Expr, `queue=~"$queue"`) || p.Type == "heatmap" {
				continue
			}
			n++
			if !regexp.MustCompile(`(sum|max) by \(queue[,)]`).MatchString(tg.Expr) || !strings.Contains(tg.LegendFormat, "{{queue}}") {
				t.Errorf("%s: %s (legend %q) does not show each queue", p.Title, tg.Expr, tg.LegendFormat)
			}
		}
	}
	if n < 10 {
		t.Errorf("%d queue targets", n)
	}
}

// Issue 42: a retry rate's denominator is the attempts made: deferrals
// (the breaker or the budget put the job back, spending no attempt) left
// out, as the rules compute it; during an outage they diluted the rate.
func TestRetryRatesLeaveDeferralsOut(t *testing.T) {
	n := 0
	for name, d := range dashboards.All() {
		for _, p := range d.Panels {
			for _, tg := range p.Targets {
				if strings.Contains(tg.Expr, `backstop_attempts_total{`) && strings.Contains(tg.Expr, `outcome="retry"`) && strings.Contains(tg.Expr, "/") {
					n++
					if !strings.Contains(tg.Expr, `outcome!="deferred"`) {
						t.Errorf("%s, %s: the denominator counts deferrals: %s", name, p.Title, tg.Expr)
					}
				}
			}
		}
	}
	if n < 2 {
		t.Errorf("%d retry rates", n)
	}
}
