package exporter

import (
	"bytes"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
)

// scrapeBody prepares the golden queues, serves them over HTTP and returns
// a real scrape's body.
func scrapeBody(t *testing.T) []byte {
	t.Helper()
	rdb := redistest.Start(t).Client()
	prepareOrders(t, rdb)
	prepareLegacy(t, rdb)
	prepareLagless(t, rdb)
	qs, err := LoadQueuesConfig("testdata/queues.yaml")
	must(t, err)
	c, _ := newTestCollector(t, rdb, WithQueues(qs...))
	resp, err := http.Get(serve(t, c))
	must(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	must(t, err)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s\n%s", resp.Status, body)
	}
	return body
}

// TestExposition parses a real scrape with expfmt and lints it with
// promlint (the checks of `promtool check metrics`): counters are counters,
// histograms histograms, every metric documented.
func TestExposition(t *testing.T) {
	body := scrapeBody(t)
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("exposition does not parse: %v\n%s", err, body)
	}
	types := map[string]dto.MetricType{}
	for name, mf := range mfs {
		types[name] = mf.GetType()
		if mf.GetHelp() == "" {
			t.Errorf("%s has no HELP", name)
		}
	}
	for name, typ := range map[string]dto.MetricType{
		"backstop_attempts_total":            dto.MetricType_COUNTER,
		"backstop_dlq_ingested_total":        dto.MetricType_COUNTER,
		"backstop_scrape_errors_total":       dto.MetricType_COUNTER,
		"backstop_job_attempts":              dto.MetricType_HISTOGRAM,
		"backstop_stream_pending_deliveries": dto.MetricType_HISTOGRAM,
		"backstop_delayed_queue_size":        dto.MetricType_GAUGE,
		"backstop_up":                        dto.MetricType_GAUGE,
		"backstop_exporter_build_info":       dto.MetricType_GAUGE,
	} {
		if types[name] != typ {
			t.Errorf("%s is %v, want %v", name, types[name], typ)
		}
	}
	problems, err := promlint.New(bytes.NewReader(body)).Lint()
	must(t, err)
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

// TestPromtool runs `promtool check metrics` on a real scrape. It needs
// promtool (Debian package prometheus, which `make test` installs).
func TestPromtool(t *testing.T) {
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found on PATH: run `make test`, which installs the Debian package prometheus")
	}
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = bytes.NewReader(scrapeBody(t))
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}
