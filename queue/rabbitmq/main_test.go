package rabbitmq

import (
	"os"
	"sync"
	"testing"

	"github.com/backstop-dev/backstop/internal/rabbittest"
)

// shared is one broker for the package's tests that neither restart nor
// kill it: a broker takes ~6 s to start. Each test uses its own queue
// names. Started on first use, stopped by TestMain.
var shared struct {
	once sync.Once
	b    *rabbittest.Broker
	err  error
}

func sharedBroker(t testing.TB) *rabbittest.Broker {
	t.Helper()
	shared.once.Do(func() { shared.b, shared.err = rabbittest.StartProcess() })
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.b
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.b != nil {
		shared.b.Stop()
	}
	os.Exit(code)
}
