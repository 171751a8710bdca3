package host

import (
	"fmt"
	"io"
	"log/slog"
	"runtime"
)

// Option configures New. Options are applied in order over the defaults;
// invalid values are reported by New, not by the option itself.
type Option func(*config)

type config struct {
	wasm     []byte
	cacheDir string
	poolSize int
	output   io.Writer
	logger   *slog.Logger

	// memoryLimitPages caps each instance's linear memory (wazero's
	// default, 0, is 4 GiB). Only tests set it, to make an instance run out
	// of memory, and trap, cheaply.
	memoryLimitPages uint32
}

// defaults returns the configuration New starts from.
func defaults() config {
	return config{wasm: backstopWasm, poolSize: runtime.GOMAXPROCS(0), output: io.Discard, logger: slog.New(slog.DiscardHandler)}
}

func (c *config) validate() error {
	if c.poolSize < 1 {
		return fmt.Errorf("backstop: pool size must be >= 1 (got %d)", c.poolSize)
	}
	if len(c.wasm) == 0 {
		return fmt.Errorf("backstop: the module is empty")
	}
	return nil
}

// WithCompilationCache keeps compiled code in dir, so the next Runtime that
// uses the same dir (in this process or another) starts without compiling.
// The default is no cache: each New compiles the module.
func WithCompilationCache(dir string) Option {
	return func(c *config) { c.cacheDir = dir }
}

// WithPoolSize bounds the number of module instances a Runtime creates,
// which bounds both its memory (each instance holds a Go heap of a few
// MiB) and the number of decisions it runs at once. Instances are created
// on demand. The default is runtime.GOMAXPROCS(0).
func WithPoolSize(n int) Option {
	return func(c *config) { c.poolSize = n }
}

// WithModule runs the given module bytes instead of the embedded
// backstop.wasm, for example one built from a modified policy core. It must
// implement the ABI version this package knows (see wasm/ABI.md).
func WithModule(wasm []byte) Option {
	return func(c *config) { c.wasm = wasm }
}

// WithOutput sends what the module writes to stdout and stderr (only a Go
// runtime crash report, in practice) to w, for debugging. The default
// discards it.
func WithOutput(w io.Writer) Option {
	return func(c *config) { c.output = w }
}

// WithLogger logs each lint of a policy as it loads (docs/policy.md,
// "Lints"): a warning "backstop: policy lint" with its code, field and
// reason. The default logs nothing; (*Policy).Lints returns them either
// way.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.logger = l
		}
	}
}
