package rabbitmq_test

import (
	"context"
	"strings"
	"testing"

	"github.com/backstop-dev/backstop/queue/rabbitmq"
)

// Issue 40, fault 7: Open's error (amqp091-go returns net/url's parse
// error, which quotes the URL) and the management API's never show a
// URL's password, parseable or not, with one URL or with failover.
func TestErrorsShowNoPassword(t *testing.T) {
	ctx := context.Background()
	for _, pw := range []string{"hunter2-Pw0rd", "hunter2%Pw0rd", "hunter2 Pw0rd", "hunter2%25Pw0rd"} {
		u := "amqp://app:" + pw + "@127.0.0.1:1/"
		for _, opts := range [][]rabbitmq.Option{nil, {rabbitmq.WithFailover("amqp://app:" + pw + "@127.0.0.1:2/")}} {
			_, err := rabbitmq.Open(ctx, u, opts...)
			if err == nil {
				t.Fatalf("Open(%q) reached a broker", u)
			}
			if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "Pw0rd") {
				t.Errorf("Open with password %q: %v", pw, err)
			}
		}
	}
}
