package rabbitmq

// WithoutMover runs Work without the delay mover, for the shared cases,
// which read where a delayed message lands.
func WithoutMover() WorkOption { return func(c *workConfig) { c.noMover = true } }
