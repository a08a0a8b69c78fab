package server

import "time"

// WithClock sets the middleware's clock, for tests in package server_test.
func WithClock(c Config, now func() time.Time) Config {
	c.now = now
	return c
}
