package host

import (
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/sys"
)

// Virtual time (wasm/ABI.md, "Clocks"). The module never sees the host's
// clock: only the Go runtime inside it reads a clock, to pace its garbage
// collector, and decisions take time as an input.
const (
	// clockEpoch is what the module's realtime clock reads at virtual time
	// 0: 2022-01-01T00:00:00Z, wazero's fake epoch.
	clockEpoch = 1_640_995_200_000_000_000
	// clockCall is how far virtual time moves before each call.
	clockCall = 1_000_000 // 1 ms
)

// clock is one instance's virtual clock, in nanoseconds. It stands still
// during a call except for 1 ns per reading (so readings increase), moves
// clockCall before each call (tick), and a sleep (poll_oneoff on a clock)
// moves it by the time asked and returns at once.
//
// Why: the Go runtime's GC CPU limiter compares GC time with mutator time.
// In a reactor the module's own code never reads the clock, and with
// wazero's default clocks (1 ms per reading) nearly all "time" is GC time,
// so after about 100 cycles the limiter switches off the mark assists that
// are the only way a reactor's GC cycle can end, and the heap grows until
// the instance traps. A real clock does the same when the host pauses for a
// second during a GC phase. Virtual time makes GC time nanoseconds and puts
// a millisecond of mutator time between calls: the limiter stays off.
//
// An instance is single-threaded (calls hold its mutex), so ns needs no
// synchronisation: the guest reads it only during calls.
type clock struct{ ns int64 }

// tick moves the clock on before a call.
func (c *clock) tick() { c.ns += clockCall }

// config returns cfg with the module's clocks and sleep reading c.
func (c *clock) config(cfg wazero.ModuleConfig) wazero.ModuleConfig {
	return cfg.
		WithNanotime(func() int64 {
			c.ns++
			return c.ns
		}, sys.ClockResolution(1)).
		WithWalltime(func() (int64, int32) {
			c.ns++
			t := clockEpoch + c.ns
			return t / 1e9, int32(t % 1e9)
		}, sys.ClockResolution(1)).
		WithNanosleep(func(ns int64) { c.ns += max(ns, 0) })
}
