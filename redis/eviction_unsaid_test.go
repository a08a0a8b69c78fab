package redis_test

import (
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/redis"
)

// A server that refuses CONFIG GET (an ACL user without it, a managed
// service) still tells its maxmemory-policy in INFO memory: an evicting
// policy is refused there too, not accepted because CONFIG was.
func TestOpenRefusesAnEvictingPolicyWhenConfigIsRefused(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--save", "", "--appendonly", "no", "--maxmemory-policy", "volatile-lru", "--rename-command", "CONFIG", ""},
		{"--save", "", "--appendonly", "no", "--maxmemory-policy", "allkeys-lru"},
	} {
		proc := startRedis(t, args...)
		admin := newClient(t, proc.addr(), time.Second)
		c := admin
		if len(args) == 6 {
			require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "app", "on", ">pw", "~*", "+@all", "-config").Err())
			c = goredis.NewClient(&goredis.Options{Addr: proc.addr(), Username: "app", Password: "pw", MaxRetries: -1})
			t.Cleanup(func() { _ = c.Close() })
			require.ErrorContains(t, c.ConfigGet(ctx, "maxmemory-policy").Err(), "NOPERM", "the user may not run CONFIG")
		}
		_, err := redis.Open(ctx, c, redis.Logger(quiet))
		require.ErrorIs(t, err, redis.ErrEvicts, "%v", args)
		s, err := redis.Open(ctx, c, redis.Logger(quiet), redis.AllowEviction())
		require.NoError(t, err, "AllowEviction accepts it")
		require.False(t, s.Durability().Known, "CONFIG GET was refused")
	}
}
