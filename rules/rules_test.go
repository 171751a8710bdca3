package rules_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	amconfig "github.com/prometheus/alertmanager/config"
	"github.com/prometheus/alertmanager/dispatch"
	"github.com/prometheus/alertmanager/pkg/labels"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"

	"github.com/backstop-dev/backstop/rules"
)

// The shipped rule files are the generator's output for the defaults.
func TestShippedFilesAreGenerated(t *testing.T) {
	files, err := rules.Files(rules.Default())
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range files {
		got, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("rules/%s is not what `backstop rules generate` writes: run it and commit the result", name)
		}
	}
}

func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: run `make test`, which installs the Debian package prometheus")
	}
	return p
}

func TestPromtoolCheckAndTestRules(t *testing.T) {
	bin := promtool(t)
	if out, err := exec.Command(bin, "check", "rules", "backstop.rules.yml", "backstop.alerts.yml").CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	tests, _ := filepath.Glob("tests/*.test.yml")
	if len(tests) < 2 {
		t.Fatalf("rule tests: %v", tests)
	}
	args := []string{"test", "rules"}
	for _, f := range tests {
		args = append(args, filepath.Base(f))
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = "tests"
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}

// Every alert has the annotations, a severity, and both a firing and a
// silent case in the promtool tests (one file per area).
func TestEveryAlertIsComplete(t *testing.T) {
	files, _ := filepath.Glob("tests/*.test.yml")
	var tests []byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		tests = append(tests, b...)
	}
	for _, r := range rules.Alerts(rules.Default()).Groups[0].Rules {
		if !slices.Contains([]string{"critical", "warning", "info"}, r.Labels["severity"]) {
			t.Errorf("%s: severity %q", r.Alert, r.Labels["severity"])
		}
		for _, a := range []string{"summary", "description", "runbook_url", "dashboard_url"} {
			if r.Annotations[a] == "" {
				t.Errorf("%s: no %s", r.Alert, a)
			}
		}
		firing := strings.Count(string(tests), "alertname: "+r.Alert+"\n        exp_alerts:")
		all := strings.Count(string(tests), "alertname: "+r.Alert+"\n")
		if firing == 0 || all-firing == 0 {
			t.Errorf("%s: %d firing and %d silent cases in tests/*.test.yml; want at least one of each", r.Alert, firing, all-firing)
		}
	}
}

func TestConfigIsStrict(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(path, []byte("dlq_page_per_secnd: 1\n"), 0o644)
	if _, err := rules.LoadConfig(path); err == nil || !strings.Contains(err.Error(), "dlq_page_per_secnd") {
		t.Errorf("unknown field: %v", err)
	}
	os.WriteFile(path, []byte("crash_loop_deliveries: 4\n"), 0o644)
	if _, err := rules.LoadConfig(path); err == nil || !strings.Contains(err.Error(), "crash_loop_deliveries") {
		t.Errorf("bad bucket: %v", err)
	}
	os.WriteFile(path, []byte("selector: 'job=\"queues\"'\ndisabled_alerts: [BackstopDeadLetter]\n"), 0o644)
	c, err := rules.LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules.Alerts(c).Groups[0].Rules {
		if r.Alert == "BackstopDeadLetter" {
			t.Error("a disabled alert was generated")
		}
		if strings.Contains(r.Expr, `job="backstop"`) {
			t.Errorf("%s ignores the selector: %s", r.Alert, r.Expr)
		}
	}
}

// The example Alertmanager configuration routes critical alerts to the
// pager, warnings to tickets, groups by queue, and inhibits queue alerts
// while the exporter or Redis is down.
func TestAlertmanagerRoutes(t *testing.T) {
	cfg, err := amconfig.LoadFile("alertmanager.yml")
	if err != nil {
		t.Fatal(err)
	}
	route := dispatch.NewRoute(cfg.Route, nil)
	for _, r := range rules.Alerts(rules.Default()).Groups[0].Rules {
		ls := model.LabelSet{"alertname": model.LabelValue(r.Alert), "queue": "orders"}
		for k, v := range r.Labels {
			ls[model.LabelName(k)] = model.LabelValue(v)
		}
		matched := route.Match(ls)
		if len(matched) != 1 {
			t.Fatalf("%s matches %d routes", r.Alert, len(matched))
		}
		want := map[string]string{"critical": "pager", "warning": "ticket"}[r.Labels["severity"]]
		if got := matched[0].RouteOpts.Receiver; got != want {
			t.Errorf("%s (%s) goes to %s, want %s", r.Alert, r.Labels["severity"], got, want)
		}
		if _, ok := matched[0].RouteOpts.GroupBy["queue"]; !ok {
			t.Errorf("%s is not grouped by queue", r.Alert)
		}
	}
	// Issue 42: an exporter that cannot read its source mutes its own
	// queue alerts only (equal: instance); before, one exporter's
	// BackstopRedisDown muted the queue alerts of every other Redis.
	inhibits := func(src, target model.LabelSet) bool {
		for _, rule := range cfg.InhibitRules {
			if !labels.Matchers(rule.SourceMatchers).Matches(src) || !labels.Matchers(rule.TargetMatchers).Matches(target) {
				continue
			}
			equal := true
			for _, l := range rule.Equal {
				equal = equal && src[model.LabelName(l)] == target[model.LabelName(l)]
			}
			if equal {
				return true
			}
		}
		return false
	}
	down := model.LabelSet{"alertname": "BackstopSourceDown", "severity": "critical", "instance": "e:9797"}
	absent := model.LabelSet{"alertname": "BackstopExporterAbsent", "severity": "critical", "job": "backstop"}
	inhibited := 0
	for _, r := range rules.Alerts(rules.Default()).Groups[0].Rules {
		if !strings.Contains(r.Expr, "by (instance, queue") && !strings.HasPrefix(r.Expr, "queue") {
			continue // not a queue alert of one exporter
		}
		same := model.LabelSet{"alertname": model.LabelValue(r.Alert), "queue": "orders", "instance": "e:9797"}
		other := model.LabelSet{"alertname": model.LabelValue(r.Alert), "queue": "orders", "instance": "f:9797"}
		if !inhibits(down, same) || !inhibits(absent, same) {
			t.Errorf("%s is not held back while its exporter cannot read its source, or no exporter is scraped", r.Alert)
		}
		if inhibits(down, other) {
			t.Errorf("%s of another exporter is held back by BackstopSourceDown", r.Alert)
		}
		inhibited++
	}
	if inhibited != 12 {
		t.Errorf("%d queue alerts, want 12", inhibited)
	}
}

// rules/config.yaml documents exactly the defaults.
func TestConfigFileIsTheDefaults(t *testing.T) {
	c, err := rules.LoadConfig("config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c.Disabled = nil
	if !reflect.DeepEqual(c, rules.Default()) {
		t.Errorf("rules/config.yaml = %+v\nDefault() = %+v", c, rules.Default())
	}
}

// A configuration is read up to 1 MiB and one byte: a path to a huge file
// (or a device) used to be read whole into memory.
func TestConfigSizeIsBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.yaml")
	os.WriteFile(path, []byte("down_for: 3m\n#"+strings.Repeat("x", 2<<20)+"\n"), 0o644)
	if _, err := rules.LoadConfig(path); err == nil || err.Error() != path+": must be at most 1048576 bytes (1 MiB)" {
		t.Errorf("a 2 MiB configuration: %v", err)
	}
	os.WriteFile(path, []byte("down_for: 3m\n#"+strings.Repeat("x", 1<<19)+"\n"), 0o644)
	if c, err := rules.LoadConfig(path); err != nil || c.DownFor != "3m" {
		t.Errorf("a 512 KiB configuration: %v", err)
	}
}

// Every alert's runbook_url anchor is a section of docs/runbooks.md.
func TestEveryAlertHasARunbook(t *testing.T) {
	doc, err := os.ReadFile("../docs/runbooks.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules.Alerts(rules.Default()).Groups[0].Rules {
		if !strings.Contains(string(doc), "\n## "+r.Alert+"\n") {
			t.Errorf("%s: no section \"## %s\" in docs/runbooks.md", r.Alert, r.Alert)
		}
	}
}

// Issue 42: one dead letter on a typed queue fired three alerts
// (BackstopDeadLetter, BackstopMaxAttemptsReached,
// BackstopJobTypeDeadLetters); now BackstopDeadLetter alone fires, and
// every other alert of the shipped rules stays silent.
func TestOneDeadLetterFiresOneAlert(t *testing.T) {
	bin := promtool(t)
	abs, _ := filepath.Abs(".")
	var b strings.Builder
	fmt.Fprintf(&b, `rule_files: [%q, %q]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'backstop_up{job="backstop", instance="e:9797"}'
        values: '1x20'
      - series: 'backstop_dlq_ingested_total{job="backstop", instance="e:9797", queue="shop"}'
        values: '0 0 0 1x17'
      - series: 'backstop_dlq_size{job="backstop", instance="e:9797", queue="shop"}'
        values: '0 0 0 1x17'
      - series: 'backstop_max_attempts_reached_total{job="backstop", instance="e:9797", queue="shop"}'
        values: '0 0 0 1x17'
      - series: 'backstop_dead_letters_total{job="backstop", instance="e:9797", queue="shop", job_type="charge_card", reason="max_attempts_reached"}'
        values: '0 0 0 1x17'
      - series: 'backstop_attempts_total{job="backstop", instance="e:9797", queue="shop", job_type="charge_card", outcome="dead_letter"}'
        values: '0 0 0 1x17'
    alert_rule_test:
`, filepath.Join(abs, "backstop.rules.yml"), filepath.Join(abs, "backstop.alerts.yml"))
	// Every alert of the file promtool loads, so that an alert added or
	// kept beside BackstopDeadLetter is checked to stay silent too.
	var shipped rules.File
	if b, err := os.ReadFile("backstop.alerts.yml"); err != nil || yaml.Unmarshal(b, &shipped) != nil {
		t.Fatalf("backstop.alerts.yml: %v", err)
	}
	fired := 0
	for _, r := range shipped.Groups[0].Rules {
		fmt.Fprintf(&b, "      - eval_time: 6m\n        alertname: %s\n", r.Alert)
		if r.Alert == "BackstopDeadLetter" {
			fired++
			b.WriteString(`        exp_alerts:
          - exp_labels: {severity: warning, instance: "e:9797", queue: shop}
            exp_annotations:
              summary: New dead letters on queue shop.
              description: 'Queue shop dead-lettered 1 jobs in the last 10 minutes. Their reasons and job types: ` + "`backstop dlq inspect --queue shop`" + `, and the dashboard''s dead letters by reason and by job type; once fixed, ` + "`backstop dlq replay --queue shop`" + ` (--reason, --type) moves them back.'
              runbook_url: https://github.com/backstop-dev/backstop/blob/main/docs/runbooks.md#backstopdeadletter
              dashboard_url: http://localhost:3000/d/backstop-queue/backstop-queue?var-queue=shop
`)
		}
	}
	if fired != 1 {
		t.Fatal("no BackstopDeadLetter in the rules")
	}
	path := filepath.Join(t.TempDir(), "one.test.yml")
	os.WriteFile(path, []byte(b.String()), 0o644)
	if out, err := exec.Command(bin, "test", "rules", path).CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}

// Issue 42: a configuration written before grafana_url says what replaced
// dashboard_url, not "unknown field".
func TestOldDashboardURLIsExplained(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.yaml")
	os.WriteFile(path, []byte("dashboard_url: /d/backstop-queue/backstop-queue\n"), 0o644)
	if _, err := rules.LoadConfig(path); err == nil || !strings.Contains(err.Error(), "dashboard_url is replaced by grafana_url") {
		t.Errorf("old dashboard_url: %v", err)
	}
}

// Issue 46: with console_url set, the dead-letter alerts link to the
// console's list of their queue's dead letters (tests/console, run by
// promtool on rules generated for that configuration); without it
// (the shipped rules) no alert has a console_url.
func TestConsoleURLAnnotation(t *testing.T) {
	bin := promtool(t)
	c := rules.Default()
	c.ConsoleURL = "https://console.example.com"
	files, err := rules.Files(c)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	test, err := os.ReadFile("tests/console/console.test.yml")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "console.test.yml"), test, 0o644)
	cmd := exec.Command(bin, "test", "rules", "console.test.yml")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	for _, r := range rules.Alerts(rules.Default()).Groups[0].Rules {
		if u, ok := r.Annotations["console_url"]; ok {
			t.Errorf("%s: console_url %q with no console configured", r.Alert, u)
		}
	}
}
