package main

import (
	"fmt"
	"html"
	"net/http"
	"net/url"
	"sort"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"

	"github.com/backstop-dev/backstop/exporter"
)

// landing is the exporter's landing page: what a user checks first (the
// Redis target, backstop_up, the queues, each with a link to its figures),
// read from a collection when the page is asked for, in exporter-toolkit's
// page.
type landing struct {
	reg         *prometheus.Registry // the collector alone
	target      string
	metricsPath string
	links       []web.LandingLinks
}

func newLanding(c *exporter.Collector, target, metricsPath string, links []web.LandingLinks) *landing {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	return &landing{reg: reg, target: target, metricsPath: metricsPath, links: links}
}

// status collects once: backstop_up and the queues' names (any series
// with a queue label), sorted.
func (l *landing) status() (up string, queues []string) {
	fams, _ := l.reg.Gather() // a partial gather still tells up and the queues
	up = "unknown"
	seen := map[string]bool{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			if f.GetName() == "backstop_up" {
				up = fmt.Sprint(m.GetGauge().GetValue())
			}
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "queue" && !seen[lp.GetValue()] {
					seen[lp.GetValue()] = true
					queues = append(queues, lp.GetValue())
				}
			}
		}
	}
	sort.Strings(queues)
	return up, queues
}

func (l *landing) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/" {
		http.NotFound(w, r)
		return
	}
	up, queues := l.status()
	var b strings.Builder
	server, target := "Redis", l.target
	if t, ok := strings.CutPrefix(target, "RabbitMQ "); ok { // rabbitFlags.target
		server, target = "RabbitMQ", t
	}
	fmt.Fprintf(&b, "<h2>Status</h2>\n<table>\n<tr><th>%s</th><td>%s</td></tr>\n<tr><th>backstop_up</th><td>%s</td></tr>\n<tr><th>queues</th><td>%d</td></tr>\n</table>\n",
		server, html.EscapeString(target), html.EscapeString(up), len(queues))
	if len(queues) > 0 {
		b.WriteString("<h2>Queues</h2>\n<ul>\n")
		for _, q := range queues {
			fmt.Fprintf(&b, "<li><a href=\"queue?name=%s\">%s</a></li>\n", url.QueryEscape(q), html.EscapeString(q))
		}
		b.WriteString("</ul>\n")
	}
	page, err := web.NewLandingPage(web.LandingConfig{
		Name:        name,
		Description: "Prometheus exporter of backstop's Redis queues",
		Version:     version.Info(),
		Profiling:   "false", // no pprof handlers here
		Links:       l.links,
		ExtraHTML:   b.String(),
		ExtraCSS:    "table { border-collapse: collapse; } th { text-align: left; padding-right: 1em; }",
	})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	page.ServeHTTP(w, r)
}

// queuePage serves one queue's series (/queue?name=Q) in the text format:
// the figures of the queue the landing page links to.
func (l *landing) queuePage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query().Get("name")
	fams, _ := l.reg.Gather()
	format := expfmt.NewFormat(expfmt.TypeTextPlain)
	var out []string
	var found bool
	for _, f := range fams {
		var keep = f.Metric[:0:0]
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "queue" && lp.GetValue() == q {
					keep = append(keep, m)
				}
			}
		}
		if len(keep) == 0 {
			continue
		}
		found = true
		f.Metric = keep
		var sb strings.Builder
		if err := expfmt.NewEncoder(&sb, format).Encode(f); err == nil {
			out = append(out, sb.String())
		}
	}
	if !found {
		http.Error(w, fmt.Sprintf("no queue %q among the exporter's queues", q), http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", string(format))
	fmt.Fprint(w, strings.Join(out, ""))
}
