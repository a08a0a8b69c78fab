package redis_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/redis"
	"github.com/idemkit/idem/server"
)

// Sweep under the caller clock runs its script on the store's own keys
// only (SCAN with MATCH on its prefix, glob characters quoted): never on
// another store's keys, nor on keys a wider pattern would take in, however
// many there are.
func TestSweepTouchesOnlyItsPrefix(t *testing.T) {
	t.Parallel()
	proc := startRedis(t, "--save", "", "--appendonly", "no")
	c := newClient(t, proc.addr(), 5*time.Second)
	// A prefix with glob characters: unquoted, "a*b:" would match "axxb:".
	mine, err := redis.Open(ctx, c, redis.Prefix("a*b:"), redis.WithClock(redis.CallerClock), redis.Logger(quiet))
	require.NoError(t, err)
	t.Cleanup(func() { _ = mine.Close() })
	other, err := redis.Open(ctx, c, redis.Prefix("axxb:"), redis.WithClock(redis.CallerClock), redis.Logger(quiet))
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })

	now := time.Now()
	const own, others, foreign = 7, 5, 3000
	for i := range own {
		r, err := mine.Claim(ctx, claimAt("t", "k"+strconv.Itoa(i), now, time.Minute))
		require.NoError(t, err)
		require.True(t, r.Claimed)
	}
	for i := range others {
		_, err := other.Claim(ctx, claimAt("t", "k"+strconv.Itoa(i), now, time.Minute))
		require.NoError(t, err)
	}
	p := c.Pipeline()
	for i := range foreign {
		p.Set(ctx, fmt.Sprintf("app:{%d}", i), "x", 0)
	}
	_, err = p.Exec(ctx)
	require.NoError(t, err)

	require.NoError(t, c.ConfigResetStat(ctx).Err())
	n, err := mine.Sweep(ctx, now.Add(25*time.Hour))
	require.NoError(t, err)
	assert.Equal(t, own, n, "the store's expired entries are swept")
	stats := c.Info(ctx, "commandstats").Val()
	assert.Equal(t, own, scriptCalls(stats), "one script per key of the store's, none on the %d others: %s", others+foreign, stats)
	assert.EqualValues(t, others+foreign, c.DBSize(ctx).Val(), "every other key is left")
	e, err := other.Get(ctx, "t", "k0", now)
	require.NoError(t, err, "the other store's entry is still there")
	assert.Equal(t, server.InProgress, e.State)
}

// scriptCalls counts the EVAL and EVALSHA calls of INFO commandstats that
// ran (a NOSCRIPT is a failed call, sent again as EVAL).
func scriptCalls(stats string) int {
	n := 0
	for _, line := range strings.Split(stats, "\n") {
		for _, cmd := range []string{"cmdstat_evalsha:", "cmdstat_eval:"} {
			v, ok := strings.CutPrefix(strings.TrimSpace(line), cmd)
			if !ok {
				continue
			}
			for _, field := range strings.Split(v, ",") {
				name, value, _ := strings.Cut(field, "=")
				count, _ := strconv.Atoi(value)
				switch name {
				case "calls":
					n += count
				case "failed_calls":
					n -= count
				}
			}
		}
	}
	return n
}
