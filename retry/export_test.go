package retry

import (
	"context"
	"time"
)

// FakeClock is a clock that moves only when told or slept on: tests never
// sleep.
type FakeClock struct {
	T      time.Time
	Sleeps []time.Duration
	// OnSleep, when set, runs before each sleep (to cancel a context).
	OnSleep func()
}

func (c *FakeClock) Now() time.Time { return c.T }

func (c *FakeClock) Sleep(ctx context.Context, d time.Duration) error {
	c.Sleeps = append(c.Sleeps, d)
	if c.OnSleep != nil {
		c.OnSleep()
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	c.T = c.T.Add(d)
	return nil
}

// WithClock and WithRandom are the seams the package's tests use.
func WithClock(c *FakeClock) Option { return func(cfg *config) { cfg.clock = c } }

func WithRandom(r float64) Option {
	return func(cfg *config) { cfg.random = func() float64 { return r } }
}
