package exporter

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/resp"
	"github.com/backstop-dev/backstop/internal/testing/logbuf"
)

// clock is the fixed "now" of the tests whose data carries fixed times:
// 100 s after the stream ids 1700000000000-n they write.
var clock = time.UnixMilli(1700000100000)

// newTestCollector returns a collector over rdb with the fixed clock and a
// logger into the returned buffer.
func newTestCollector(t testing.TB, rdb redis.UniversalClient, opts ...Option) (*Collector, *logbuf.Buffer) {
	t.Helper()
	logs := &logbuf.Buffer{}
	opts = append([]Option{WithLogger(slog.New(slog.NewTextHandler(logs, nil)))}, opts...)
	c, err := NewCollector(rdb, opts...)
	if err != nil {
		t.Fatal(err)
	}
	c.cfg.now = func() time.Time { return clock }
	return c, logs
}

// transportOf is how a Redis collector reads its queues.
func transportOf(c *Collector) resp.Transport { return c.src.(*redisSource).tr }

// gather collects c once and returns every sample by its series:
// `name{label="value",...}`, histograms as their _bucket, _sum and _count
// series. It fails on a metric of an unexpected type.
func gather(t testing.TB, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := labelPairs(m.GetLabel())
			switch mf.GetType() {
			case dto.MetricType_GAUGE:
				out[series(mf.GetName(), labels)] = m.GetGauge().GetValue()
			case dto.MetricType_COUNTER:
				out[series(mf.GetName(), labels)] = m.GetCounter().GetValue()
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				out[series(mf.GetName()+"_count", labels)] = float64(h.GetSampleCount())
				out[series(mf.GetName()+"_sum", labels)] = h.GetSampleSum()
				for _, b := range h.GetBucket() {
					le := append(append([]string(nil), labels...), `le="`+strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)+`"`)
					out[series(mf.GetName()+"_bucket", le)] = float64(b.GetCumulativeCount())
				}
			default:
				t.Fatalf("%s: unexpected type %v", mf.GetName(), mf.GetType())
			}
		}
	}
	return out
}

func labelPairs(ls []*dto.LabelPair) []string {
	var out []string
	for _, l := range ls {
		out = append(out, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	return out
}

func series(name string, labels []string) string {
	if len(labels) == 0 {
		return name
	}
	sort.Strings(labels)
	return name + "{" + strings.Join(labels, ",") + "}"
}

// want checks the values of some series, and that the ones given as
// absent are.
func want(t testing.TB, got map[string]float64, values map[string]float64, absent ...string) {
	t.Helper()
	for k, v := range values {
		g, ok := got[k]
		if !ok {
			t.Errorf("%s missing", k)
		} else if g != v {
			t.Errorf("%s = %v, want %v", k, g, v)
		}
	}
	for _, k := range absent {
		if v, ok := got[k]; ok {
			t.Errorf("%s = %v, want it absent", k, v)
		}
	}
}

// commandCalls returns the commands the server ran since the last call (by
// INFO commandstats, then CONFIG RESETSTAT), leaving out those two and a
// connection's handshake.
func commandCalls(t testing.TB, admin *redis.Client) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	info, err := admin.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	calls := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		name = strings.TrimPrefix(name, "cmdstat_")
		// Leave out the counting itself, and the handshake of a new
		// connection: the nodes' INFO runs beside the queues' pipeline, so
		// a scrape may open a second connection the warm-up did not.
		if name == "info" || strings.HasPrefix(name, "config") || name == "hello" || name == "client|setinfo" {
			continue
		}
		n, _, _ := strings.Cut(rest, ",")
		calls[name], _ = strconv.ParseInt(n, 10, 64)
	}
	return calls
}

func total(calls map[string]int64) int64 {
	var n int64
	for _, v := range calls {
		n += v
	}
	return n
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
