package rabbitmq

import (
	"os"
	"testing"

	"github.com/backstop-dev/backstop/internal/testing/rabbittest"
)

// shared is one broker for the package's tests that neither restart nor
// kill it, each on its own queue names.
var shared rabbittest.Shared

func TestMain(m *testing.M) { os.Exit(shared.Run(m)) }
