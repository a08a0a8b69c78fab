package redis_test

import (
	"testing"

	"github.com/idemkit/idem/redis"
	"github.com/idemkit/idem/server"
	"github.com/idemkit/idem/server/storetest"
)

// The suite drives time through the instants it passes, so it runs on the
// caller clock; the server clock has tests of its own (clock_test.go).
func TestStore(t *testing.T) {
	t.Parallel()
	c := machineClient(t)
	storetest.Run(t, func(t *testing.T) server.Store { return openStore(t, c, redis.WithClock(redis.CallerClock)) })
}

// The same suite with the scripts sent through the client's
// autopipeliner: batching concurrent scripts changes nothing they do.
func TestStoreAutoPipeline(t *testing.T) {
	t.Parallel()
	c := machineClient(t)
	storetest.Run(t, func(t *testing.T) server.Store {
		return openStore(t, c, redis.WithClock(redis.CallerClock), redis.AutoPipeline())
	})
}
