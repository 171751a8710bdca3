package mixin_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"reflect"
	"testing"

	"github.com/google/go-jsonnet"
	"go.yaml.in/yaml/v3"

	"github.com/backstop-dev/backstop/dashboards"
	"github.com/backstop-dev/backstop/mixin"
	"github.com/backstop-dev/backstop/rules"
)

var update = flag.Bool("update", false, "rewrite mixin.libsonnet")

// The shipped mixin.libsonnet is the generator's output.
func TestShippedMixinIsGenerated(t *testing.T) {
	want, err := mixin.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile("mixin.libsonnet", want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile("mixin.libsonnet")
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("mixin/mixin.libsonnet is not what the generator writes (%v): run `go test ./mixin -update` and commit the result", err)
	}
}

// evaluate renders the mixin with a _config override (jsonnet) and
// returns its three outputs as generic JSON values.
func evaluate(t *testing.T, override string) (alerts, recording, dash any) {
	t.Helper()
	vm := jsonnet.MakeVM()
	out, err := vm.EvaluateAnonymousSnippet("test.jsonnet", `local m = (import 'mixin.libsonnet') + { _config+:: `+override+` };
{ alerts: m.prometheusAlerts, rules: m.prometheusRules, dashboards: m.grafanaDashboards }`)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatal(err)
	}
	return v["alerts"], v["rules"], v["dashboards"]
}

// generic is a rule file as the generic value its YAML reads as.
func generic(t *testing.T, f rules.File) any {
	t.Helper()
	b, err := rules.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// The mixin with its defaults is the shipped rules and dashboards; with
// another _config it is what `backstop rules generate --config` writes for
// that configuration.
func TestMixinIsTheGeneratedRulesAndDashboards(t *testing.T) {
	alerts, recording, dash := evaluate(t, "{}")
	if !reflect.DeepEqual(alerts, generic(t, rules.Alerts(rules.Default()))) {
		t.Error("prometheusAlerts is not rules/backstop.alerts.yml")
	}
	if !reflect.DeepEqual(recording, generic(t, rules.Recording(rules.Default()))) {
		t.Error("prometheusRules is not rules/backstop.rules.yml")
	}
	want := map[string]any{}
	for name, d := range dashboards.All() {
		b, _ := dashboards.Marshal(d)
		var v any
		json.Unmarshal(b, &v)
		want[name] = v
	}
	if !reflect.DeepEqual(dash, any(want)) {
		t.Error("grafanaDashboards is not dashboards/*.json")
	}

	c := rules.Default()
	c.Selector, c.ClientSelector = `job="queues"`, `env="prod"`
	c.GrafanaURL, c.ConsoleURL = "https://grafana.example.com", "https://console.example.com"
	c.DLQPagePerSecond, c.DLQPageFor, c.TailAttempts, c.RetryRatioWarning = 0.2, "10m", 20, 0.05
	c.Disabled = []string{"BackstopDeadLetter", "BackstopDLQDepth"}
	alerts, recording, _ = evaluate(t, `{selector: 'job="queues"', client_selector: 'env="prod"', grafana_url: 'https://grafana.example.com',
		console_url: 'https://console.example.com',
		dlq_page_per_second: 0.2, dlq_page_for: '10m', tail_attempts: 20, retry_ratio_warning: 0.05,
		disabled_alerts: ['BackstopDeadLetter', 'BackstopDLQDepth']}`)
	if got, want := alerts, generic(t, rules.Alerts(c)); !reflect.DeepEqual(got, want) {
		g, _ := json.MarshalIndent(got, "", " ")
		w, _ := json.MarshalIndent(want, "", " ")
		t.Errorf("with a _config, prometheusAlerts is not the rules of that configuration:\n got %s\nwant %s", g, w)
	}
	if !reflect.DeepEqual(recording, generic(t, rules.Recording(c))) {
		t.Error("with a _config, prometheusRules is not the rules of that configuration")
	}
}
