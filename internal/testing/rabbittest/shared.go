package rabbittest

import (
	"sync"
	"testing"

	"github.com/backstop-dev/backstop/internal/rabbitmqserver"
)

// Shared is one broker for the tests of a package that neither restart
// nor kill it (a broker takes ~6 s to start); each test uses its own queue
// names. It starts on first use and stops when Run returns.
//
//	var shared rabbittest.Shared
//
//	func TestMain(m *testing.M) { os.Exit(shared.Run(m)) }
//
//	func TestX(t *testing.T) { b := shared.Broker(t) … }
type Shared struct {
	once sync.Once
	b    *Broker
	err  error
}

// Broker returns the shared broker, starting it on the first call; it fails
// t when the broker does not start (every later call fails the same way).
func (s *Shared) Broker(t testing.TB) *Broker {
	t.Helper()
	s.once.Do(func() {
		b, err := rabbitmqserver.Start("")
		s.b, s.err = &Broker{b}, err
	})
	if s.err != nil {
		t.Fatal(s.err)
	}
	return s.b
}

// Run runs the package's tests, then stops the broker if one started; it
// returns m.Run's exit code, for os.Exit.
func (s *Shared) Run(m *testing.M) int {
	code := m.Run()
	if s.err == nil && s.b != nil {
		s.b.Stop()
	}
	return code
}
