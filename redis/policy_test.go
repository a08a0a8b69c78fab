package redis_test

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/redis"
)

// An evicting maxmemory-policy set after Open (CONFIG SET, a managed
// service's parameter change) is seen at the next check: logged, and new
// keys refused with a 503 that names the store, as Open refuses such a
// policy, until it is noeviction again. Completions and replays go on.
func TestAnEvictingPolicySetAfterOpenIsSeen(t *testing.T) {
	t.Parallel()
	proc := startRedis(t, "--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction")
	c := newClient(t, proc.addr(), time.Second)
	var log syncBuffer
	s := openStore(t, c, redis.PolicyCheckEvery(20*time.Millisecond), redis.Logger(slog.New(slog.NewTextHandler(&log, nil))))
	a := newAPI(t, s, time.Minute)
	require.Equal(t, http.StatusCreated, a.post(t, "k1").status)

	require.NoError(t, c.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err())
	require.Eventually(t, func() bool { return strings.Contains(log.String(), "maxmemory-policy is now allkeys-lru") }, 10*time.Second, 10*time.Millisecond)
	assert.Contains(t, log.String(), "level=ERROR")
	requireStoreFailed(t, a, a.post(t, "k2"), "maxmemory-policy is now allkeys-lru")
	assert.True(t, a.post(t, "k1").replayed, "a stored response is still replayed")
	assert.Equal(t, int64(1), a.runs.Load(), "no new key ran")

	require.NoError(t, c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
	require.Eventually(t, func() bool { return strings.Contains(log.String(), "maxmemory-policy is noeviction again") }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, http.StatusCreated, a.post(t, "k2").status)
}

// With AllowEviction, a policy that evicts set after Open is logged (a
// warning) and new keys still run.
func TestAnEvictingPolicySetAfterOpenWithAllowEviction(t *testing.T) {
	t.Parallel()
	proc := startRedis(t, "--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction")
	c := newClient(t, proc.addr(), time.Second)
	var log syncBuffer
	s := openStore(t, c, redis.AllowEviction(), redis.PolicyCheckEvery(20*time.Millisecond), redis.Logger(slog.New(slog.NewTextHandler(&log, nil))))
	a := newAPI(t, s, time.Minute)
	require.NoError(t, c.ConfigSet(ctx, "maxmemory-policy", "volatile-ttl").Err())
	require.Eventually(t, func() bool { return strings.Contains(log.String(), "maxmemory-policy is now volatile-ttl") }, 10*time.Second, 10*time.Millisecond)
	assert.Contains(t, log.String(), "level=WARN")
	require.Equal(t, http.StatusCreated, a.post(t, "k1").status)
}

// Out of memory, the store asks for the policy at once, without waiting
// for the next check.
func TestOutOfMemoryChecksThePolicyAtOnce(t *testing.T) {
	t.Parallel()
	proc := startRedis(t, "--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction")
	c := newClient(t, proc.addr(), time.Second)
	var log syncBuffer
	s := openStore(t, c, redis.PolicyCheckEvery(time.Hour), redis.Logger(slog.New(slog.NewTextHandler(&log, nil))))
	a := newAPI(t, s, time.Minute)
	require.NoError(t, c.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err())
	// volatile keys only, and none: allkeys-lru cannot free anything under
	// maxmemory 1, so the write is refused.
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "1").Err())
	requireStoreFailed(t, a, a.post(t, "k1"), "out of memory")
	require.Eventually(t, func() bool { return strings.Contains(log.String(), "maxmemory-policy is now allkeys-lru") }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "0").Err())
	requireStoreFailed(t, a, a.post(t, "k1"), "maxmemory-policy is now allkeys-lru")
}
