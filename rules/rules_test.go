package rules_test

import (
	"bytes"
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
	inhibited := 0
	for _, rule := range cfg.InhibitRules {
		src := model.LabelSet{"alertname": "BackstopRedisDown", "severity": "critical", "instance": "e:9797"}
		if !labels.Matchers(rule.SourceMatchers).Matches(src) {
			continue
		}
		for _, r := range rules.Alerts(rules.Default()).Groups[0].Rules {
			if labels.Matchers(rule.TargetMatchers).Matches(model.LabelSet{"alertname": model.LabelValue(r.Alert), "queue": "orders"}) {
				inhibited++
			}
		}
	}
	if inhibited != 13 {
		t.Errorf("a Redis outage inhibits %d queue alerts, want the 13 per-queue ones", inhibited)
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
