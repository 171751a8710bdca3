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

// Issue 41: the exporter reads the brokers' queues by their names alone:
// it asks each broker's names package (rediskeys, rabbitnames), and links
// no broker's worker.
func TestExporterImportsNoBroker(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range pkg.Imports {
		switch imp {
		case "github.com/backstop-dev/backstop/queue/redisqueue", "github.com/backstop-dev/backstop/queue/rabbitmq":
			t.Errorf("exporter imports the broker %s: ask its names package instead", imp)
		}
	}
}
