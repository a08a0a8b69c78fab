package redis_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/redis"
)

var ctx = context.Background()

// machineAddr is the Redis every machine of the project runs, keeping
// nothing on disk.
const machineAddr = "127.0.0.1:6379"

// machineClient returns a client of the machine's Redis, closed when the
// test ends, or skips the test when that Redis does not answer.
func machineClient(t testing.TB) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: machineAddr})
	t.Cleanup(func() { _ = c.Close() })
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		t.Skipf("no Redis answers at %s (%v): start one with redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save '' --appendonly no", machineAddr, err)
	}
	return c
}

// testPrefix returns a key prefix of the test's own, whose keys are
// deleted when the test ends.
func testPrefix(t testing.TB, c goredis.UniversalClient) string {
	t.Helper()
	var b [8]byte
	_, _ = rand.Read(b[:])
	p := "idemtest:" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() { deletePrefix(t, c, p) })
	return p
}

func deletePrefix(t testing.TB, c goredis.UniversalClient, prefix string) {
	del := func(ctx context.Context, n goredis.UniversalClient) error {
		iter := n.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			if err := n.Del(ctx, iter.Val()).Err(); err != nil {
				return err
			}
		}
		return iter.Err()
	}
	var err error
	if cc, ok := c.(*goredis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, n *goredis.Client) error { return del(ctx, n) })
	} else {
		err = del(ctx, c)
	}
	if err != nil {
		// A test that stopped its own Redis leaves nothing to delete.
		t.Logf("the test's keys under %s were not deleted: %v", prefix, err)
	}
}

// quiet is a logger that discards, for stores whose open line the test
// does not look at.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// openStore opens a store on c under a prefix of the test's own.
func openStore(t testing.TB, c goredis.UniversalClient, opts ...redis.Option) *redis.Store {
	t.Helper()
	opts = append([]redis.Option{redis.Prefix(testPrefix(t, c)), redis.Logger(quiet)}, opts...)
	s, err := redis.Open(ctx, c, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}
