package redis_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/redis"
	"github.com/idemkit/idem/server"
)

// claimAt is the claim the middleware makes at now with the given lock
// timeout and a retention of 24 h.
func claimAt(scope, key string, now time.Time, lockTimeout time.Duration) server.ClaimRequest {
	return server.ClaimRequest{Scope: scope, Key: key, Fingerprint: "fp", Method: http.MethodPost, Path: "/orders",
		Now: now, ExpiresAt: now.Add(24 * time.Hour), StaleBefore: now.Add(-lockTimeout)}
}

// A replica whose clock runs ten minutes ahead sees, on the caller clock,
// every lock as stale and takes it over while its holder still runs; on
// the server clock it sees the lock as Redis does: fresh.
func TestServerClockIgnoresAReplicasSkew(t *testing.T) {
	t.Parallel()
	c := machineClient(t)
	for _, tc := range []struct {
		clock    redis.Clock
		takeOver bool
	}{{redis.ServerClock, false}, {redis.CallerClock, true}} {
		t.Run(string(tc.clock), func(t *testing.T) {
			s := openStore(t, c, redis.WithClock(tc.clock))
			now := time.Now()
			first, err := s.Claim(ctx, claimAt("t", "k", now, time.Minute))
			require.NoError(t, err)
			require.True(t, first.Claimed)
			ahead, err := s.Claim(ctx, claimAt("t", "k", now.Add(10*time.Minute), time.Minute))
			require.NoError(t, err)
			assert.Equal(t, tc.takeOver, ahead.Claimed, "a replica ten minutes ahead took over a lock claimed a moment ago")
		})
	}
}

func TestServerClockLetsALockLapseOnRedisTime(t *testing.T) {
	t.Parallel()
	s := openStore(t, machineClient(t))
	const lock = 200 * time.Millisecond
	first, err := s.Claim(ctx, claimAt("t", "k", time.Now(), lock))
	require.NoError(t, err)
	require.True(t, first.Claimed)
	res, err := s.Claim(ctx, claimAt("t", "k", time.Now(), lock))
	require.NoError(t, err)
	require.False(t, res.Claimed, "a fresh lock is not taken over")
	var took server.ClaimResult
	require.Eventually(t, func() bool {
		took, err = s.Claim(ctx, claimAt("t", "k", time.Now(), lock))
		return err == nil && took.Claimed
	}, 10*time.Second, 20*time.Millisecond, "the lock lapses once Redis's clock passed the lock timeout")
	assert.True(t, took.TookOver)
	assert.Greater(t, took.Token, first.Token)
	require.ErrorIs(t, s.Complete(ctx, server.CompleteRequest{Scope: "t", Key: "k", Token: first.Token,
		Response: &server.StoredResponse{Status: 201}, ExpiresAt: time.Now().Add(time.Hour)}), server.ErrLockLost,
		"the first holder's late completion is refused")
}

func TestServerClockReportsInstantsInTheCallersFrame(t *testing.T) {
	t.Parallel()
	s := openStore(t, machineClient(t))
	// A caller whose clock is a year off still reads the entry's instants
	// on its own clock.
	now := time.Now().Add(365 * 24 * time.Hour)
	res, err := s.Claim(ctx, claimAt("t", "k", now, time.Minute))
	require.NoError(t, err)
	e, err := s.Get(ctx, "t", "k", now.Add(time.Second))
	require.NoError(t, err)
	for what, at := range map[string]time.Time{"claim's LockedAt": res.Entry.LockedAt, "Get's CreatedAt": e.CreatedAt} {
		assert.WithinDuration(t, now, at, 5*time.Second, what)
	}
	assert.WithinDuration(t, now.Add(24*time.Hour), e.ExpiresAt, 5*time.Second, "ExpiresAt")
}

// The entry's TTL is its retention: from the claim, then from the
// completion, and Redis deletes it then.
func TestTTLIsTheRetention(t *testing.T) {
	t.Parallel()
	c := machineClient(t)
	s := openStore(t, c)
	key := redis.Key(s.Prefix(), "t", "k")
	now := time.Now()
	req := claimAt("t", "k", now, time.Minute)
	req.ExpiresAt = now.Add(time.Hour)
	res, err := s.Claim(ctx, req)
	require.NoError(t, err)
	ttl := c.PTTL(ctx, key).Val()
	assert.True(t, ttl > 59*time.Minute && ttl <= time.Hour, "TTL after the claim: %s", ttl)

	require.NoError(t, s.Complete(ctx, server.CompleteRequest{Scope: "t", Key: "k", Token: res.Token,
		Response: &server.StoredResponse{Status: 201, Body: []byte("x")}, ExpiresAt: time.Now().Add(300 * time.Millisecond)}))
	ttl = c.PTTL(ctx, key).Val()
	assert.True(t, ttl > 0 && ttl <= 300*time.Millisecond, "TTL after the completion: %s", ttl)
	require.Eventually(t, func() bool { return c.Exists(ctx, key).Val() == 0 }, 10*time.Second, 20*time.Millisecond,
		"Redis deletes the entry when its retention ends")
	_, err = s.Get(ctx, "t", "k", time.Now())
	require.ErrorIs(t, err, server.ErrNotFound)
	n, err := s.Sweep(ctx, time.Now())
	require.NoError(t, err)
	assert.Zero(t, n, "on the server clock Redis sweeps, not the store")

	again, err := s.Claim(ctx, claimAt("t", "k", time.Now(), time.Minute))
	require.NoError(t, err)
	require.True(t, again.Claimed)
	assert.Greater(t, again.Token, res.Token, "a key claimed after its entry expired gets a greater token than any before")
}

// A released entry leaves a tombstone with its token, so that the next
// claim's token is greater; an entry deleted outright (expired, or flushed)
// still gives a greater token, from Redis's clock.
func TestTokensIncreaseAcrossReleaseAndDeletion(t *testing.T) {
	t.Parallel()
	c := machineClient(t)
	for _, clock := range []redis.Clock{redis.ServerClock, redis.CallerClock} {
		t.Run(string(clock), func(t *testing.T) {
			s := openStore(t, c, redis.WithClock(clock))
			var last int64
			for i := range 20 {
				res, err := s.Claim(ctx, claimAt("t", "k", time.Now(), time.Minute))
				require.NoError(t, err)
				require.True(t, res.Claimed, "claim %d", i)
				require.Greater(t, res.Token, last, "claim %d", i)
				last = res.Token
				if i%2 == 0 {
					require.NoError(t, s.Release(ctx, "t", "k", res.Token))
				} else {
					require.NoError(t, c.Del(ctx, redis.Key(s.Prefix(), "t", "k")).Err())
				}
			}
		})
	}
}

// Scopes and keys are hashed into the Redis key: any bytes work, the
// Redis key's length is fixed, and the scope (a credential, here) is
// nowhere in Redis.
func TestAnyScopeAndKeyBytesAndNothingOfTheScopeStored(t *testing.T) {
	t.Parallel()
	c := machineClient(t)
	s := openStore(t, c)
	secret := "Bearer " + strings.Repeat("s3cr3t-", 450) // 3 KB
	pairs := [][2]string{
		{secret, "k"},
		{"\xff\xfe\x00tenant", "k\x00\xc3"},
		{"", strings.Repeat("k", 255)},
		{"a", "bc"}, {"ab", "c"},
	}
	for i, p := range pairs {
		res, err := s.Claim(ctx, claimAt(p[0], p[1], time.Now(), time.Minute))
		require.NoError(t, err)
		require.True(t, res.Claimed, "pair %d", i)
		require.NoError(t, s.Complete(ctx, server.CompleteRequest{Scope: p[0], Key: p[1], Token: res.Token,
			Response: &server.StoredResponse{Status: 201, Body: []byte{byte(i)}}, ExpiresAt: time.Now().Add(time.Hour)}))
	}
	for i, p := range pairs {
		e, err := s.Get(ctx, p[0], p[1], time.Now())
		require.NoError(t, err, "pair %d", i)
		assert.Equal(t, p[0], e.Scope)
		assert.Equal(t, p[1], e.Key)
		assert.Equal(t, []byte{byte(i)}, e.Response.Body, "pair %d reads its own entry", i)
	}
	keys, err := c.Keys(ctx, s.Prefix()+"*").Result()
	require.NoError(t, err)
	require.Len(t, keys, len(pairs))
	for _, k := range keys {
		assert.Len(t, k, len(s.Prefix())+66, "a key's length does not depend on the scope's")
		fields, err := c.HGetAll(ctx, k).Result()
		require.NoError(t, err)
		for name, v := range fields {
			assert.NotContains(t, v, "s3cr3t", "field %s holds part of the scope", name)
		}
	}
}
