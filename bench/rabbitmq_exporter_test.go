package bench

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/rabbittest"
	"github.com/backstop-dev/backstop/queue/rabbitmq"
)

// BenchmarkRabbitMQExporterScrape runs the real backstop-exporter binary
// with --rabbitmq.url against a real rabbitmq-server (3.10, management
// plugin) and times, side by side in the same run, for 100 and 1,000 work
// queues (each with its DLQ and its delay and due exchanges, as
// queue/rabbitmq/README.md declares them):
//
//   - exporter: one HTTP scrape of the exporter with gzip, as Prometheus
//     makes it (also: the collector's own time, backstop_scrape_duration_seconds,
//     and the gzipped size);
//   - management-api: the two requests the exporter makes to the
//     management API, /api/queues/%2F and /api/exchanges/%2F with the same
//     columns, at once, bodies read and dropped: the broker's own share.
//
// The queues hold no messages (the API's work is per queue, not per
// message); every queue has message statistics from one published message
// and its DLQ one dead letter, so every figure of the scrape is there.
func BenchmarkRabbitMQExporterScrape(b *testing.B) {
	broker := rabbittest.Start(b)
	bin := buildExporter(b)
	conn := broker.Dial(b)
	b.Setenv("BACKSTOP_RABBITMQ_USER", "guest") // the exporter's credentials, as in production: not flags
	b.Setenv("BACKSTOP_RABBITMQ_PASSWORD", "guest")
	declared := 0
	for _, n := range []int{100, 1000} {
		declareBenchQueues(b, conn, declared, n)
		declared = n
		e := runExporter(b, bin, "--rabbitmq.url="+broker.ManagementURL(), "--rabbitmq.queue-pattern=bq[0-9]+", "--scrape.timeout=30s")
		// Every queue's statistics are out (every 5 s), and the exporter sees them.
		eventually.True(b, 60*time.Second, fmt.Sprintf("%d queues in a scrape", n), func() bool {
			body, _ := managementGet(b, broker.ManagementURL()+queuesPath)
			if strings.Count(string(body), `"publish":`) != 2*n {
				return false
			}
			resp, err := http.Get(e.url)
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			scraped, _ := io.ReadAll(resp.Body)
			return strings.Contains(string(scraped), fmt.Sprintf("backstop_queues %d\n", n)) &&
				strings.Count(string(scraped), "backstop_dlq_ingested_total{") == n
		})
		// Paired: each iteration times one exporter scrape and then the
		// API's two requests, so both see the same load on the machine.
		b.Run(fmt.Sprintf("queues=%d", n), func(b *testing.B) {
			size := scrape(b, e.url)
			apiSize := managementRequests(b, broker.ManagementURL())
			var exp, api time.Duration
			for b.Loop() {
				t0 := time.Now()
				scrape(b, e.url)
				t1 := time.Now()
				managementRequests(b, broker.ManagementURL())
				exp, api = exp+t1.Sub(t0), api+time.Since(t1)
			}
			b.ReportMetric(float64(exp.Microseconds())/1000/float64(b.N), "exporter-ms/scrape")
			b.ReportMetric(float64(api.Microseconds())/1000/float64(b.N), "api-ms/scrape")
			b.ReportMetric(float64(exp)/float64(api), "x-api")
			b.ReportMetric(float64(size)/1024, "gzip-KiB/scrape")
			b.ReportMetric(float64(apiSize)/1024, "api-KiB")
			b.ReportMetric(e.collectSeconds(b)*1000, "collect-ms")
		})
	}
}

// The exporter's two requests (exporter/rabbitmq.go).
const (
	queuesPath    = "/api/queues/%2F?columns=name,messages,messages_ready,messages_unacknowledged,consumers,head_message_timestamp,arguments,message_stats.publish,message_stats.ack,message_stats.get_no_ack,message_stats.deliver_no_ack"
	exchangesPath = "/api/exchanges/%2F?columns=name,message_stats.publish_in"
)

func managementGet(b *testing.B, url string) ([]byte, error) {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.SetBasicAuth("guest", "guest")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return body, err
}

// managementRequests makes the exporter's two requests at once, as it
// does, and returns the bytes the API sent.
func managementRequests(b *testing.B, base string) int64 {
	var wg sync.WaitGroup
	sizes := make([]int64, 2)
	for i, path := range []string{queuesPath, exchangesPath} {
		wg.Go(func() {
			body, err := managementGet(b, base+path)
			if err != nil {
				b.Error(err)
			}
			sizes[i] = int64(len(body))
		})
	}
	wg.Wait()
	return sizes[0] + sizes[1]
}

// declareBenchQueues declares work queues bq<from>..bq<to-1> with their
// DLQs and exchanges, publishes one job and one dead letter to each, with
// the declarations pipelined (no-wait) and one confirm wait at the end.
func declareBenchQueues(b *testing.B, conn *amqp.Connection, from, to int) {
	b.Helper()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	acks := ch.NotifyPublish(make(chan amqp.Confirmation, 2*(to-from)))
	for i := from; i < to; i++ {
		q := fmt.Sprintf("bq%d", i)
		for _, err := range []error{
			qDeclare(ch, q, amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": rabbitmq.NamesFor(q).DLQ}),
			qDeclare(ch, rabbitmq.NamesFor(q).DLQ, amqp.Table{"x-queue-type": "quorum"}),
			ch.ExchangeDeclare(rabbitmq.NamesFor(q).Delay, "fanout", true, false, false, true, nil),
			ch.ExchangeDeclare(rabbitmq.NamesFor(q).Due, "fanout", true, false, false, true, nil),
		} {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	for i := from; i < to; i++ {
		for _, key := range []string{fmt.Sprintf("bq%d", i), fmt.Sprintf("bq%d.dlq", i)} {
			if err := ch.Publish("", key, true, false, amqp.Publishing{MessageId: "m", DeliveryMode: amqp.Persistent}); err != nil {
				b.Fatal(err)
			}
		}
	}
	for range 2 * (to - from) {
		if c := <-acks; !c.Ack {
			b.Fatal("publish nacked")
		}
	}
}

func qDeclare(ch *amqp.Channel, name string, args amqp.Table) error {
	_, err := ch.QueueDeclare(name, true, false, false, true, args)
	return err
}
