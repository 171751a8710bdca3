package exporter

import (
	"go/build"
	"strings"
	"testing"
)

// The collector sits upstream of the rules and of Alertmanager (service →
// exporter → Prometheus → rules → Alertmanager): it imports neither. The
// alerter, which needs both, lives downstream in exporter/alerter.
func TestExporterImportsNothingDownstream(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range pkg.Imports {
		if imp == "github.com/backstop-dev/backstop/rules" || strings.HasPrefix(imp, "github.com/prometheus/alertmanager/") {
			t.Errorf("exporter imports %s, downstream of it", imp)
		}
	}
}
