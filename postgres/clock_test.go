package postgres_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgtest"
	"github.com/idemkit/idem/server"
)

// skew is how far the wrong clocks below are off: far more than any lock
// timeout or lease.
const skew = time.Hour

// TestStoreJudgesTimeOnTheServersClock: two replicas share a store, one
// with a clock an hour ahead. The hour counts for nothing: the fast one
// neither takes over the lock of a handler that runs on the other, nor
// reads or sweeps a kept response as expired; and a lock taken by the
// fast one, whose handler then died, goes stale after the lock timeout,
// not an hour later.
func TestStoreJudgesTimeOnTheServersClock(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Pool(t), pgtest.Schema(t)
	right := openStoreIn(t, pool, schema)
	ahead := openStoreIn(t, newPool(t), schema)
	require.NoError(t, postgres.SkewStoreClock(ctx, ahead, skew))
	// What each replica's middleware asks, on its own clock.
	claim := func(key string, clock time.Duration, lockTimeout time.Duration) server.ClaimRequest {
		now := time.Now().Add(clock)
		return server.ClaimRequest{Scope: "tenant", Key: key, Fingerprint: "fp", Method: "POST", Path: "/orders",
			Now: now, ExpiresAt: now.Add(30 * time.Minute), StaleBefore: now.Add(-lockTimeout)}
	}

	t.Run("a live handler's lock is not stale to a clock that runs ahead", func(t *testing.T) {
		held, err := right.Claim(ctx, claim("live", 0, time.Minute))
		require.NoError(t, err)
		require.True(t, held.Claimed)
		res, err := ahead.Claim(ctx, claim("live", skew, time.Minute))
		require.NoError(t, err)
		assert.False(t, res.Claimed, "the replica whose clock is ahead took over a lock renewed a moment ago (TookOver %v)", res.TookOver)
		require.NoError(t, right.Renew(ctx, "tenant", "live", held.Token, time.Now()), "the handler still holds its key")
	})

	t.Run("a kept response is not expired to a clock that runs ahead", func(t *testing.T) {
		held, err := right.Claim(ctx, claim("kept", 0, time.Minute))
		require.NoError(t, err)
		require.True(t, held.Claimed)
		require.NoError(t, right.Complete(ctx, server.CompleteRequest{Scope: "tenant", Key: "kept", Token: held.Token,
			Response: &server.StoredResponse{Status: 201, Body: []byte("made")}, ExpiresAt: time.Now().Add(30 * time.Minute)}))
		e, err := ahead.Get(ctx, "tenant", "kept", time.Now().Add(skew))
		require.NoError(t, err, "the response kept for 30 minutes read as expired to the replica whose clock is ahead")
		assert.Equal(t, server.Completed, e.State)
		assert.WithinDuration(t, time.Now().Add(skew+30*time.Minute), e.ExpiresAt, 5*time.Second,
			"the entry's times read on the reader's own clock")
		n, err := ahead.Sweep(ctx, time.Now().Add(skew))
		require.NoError(t, err)
		assert.Zero(t, n, "the replica whose clock is ahead swept a response kept for 30 minutes")
		_, err = right.Get(ctx, "tenant", "kept", time.Now())
		require.NoError(t, err)
	})

	t.Run("a dead handler's lock goes stale after the lock timeout whatever its clock", func(t *testing.T) {
		const lockTimeout = 500 * time.Millisecond
		held, err := ahead.Claim(ctx, claim("dead", skew, lockTimeout))
		require.NoError(t, err)
		require.True(t, held.Claimed)
		// Its handler dies: nothing renews the lock. The other replica
		// takes it over once the lock timeout has passed on the server.
		deadline := time.Now().Add(10 * time.Second)
		for {
			res, err := right.Claim(ctx, claim("dead", 0, lockTimeout))
			require.NoError(t, err)
			if res.Claimed {
				assert.True(t, res.TookOver)
				break
			}
			require.True(t, time.Now().Before(deadline),
				"the lock taken by a replica whose clock is an hour ahead is kept for that hour after its handler died")
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// TestJournalJudgesTimeOnTheServersClock: two workers share a journal, one
// with a clock an hour ahead. The hour counts for nothing: the fast one
// neither claims nor acquires an operation under another worker's live
// lease, nor reads a record as past its retention when it is not; and a
// lease the fast one took, whose worker then died, lapses after its
// duration, not an hour later.
func TestJournalJudgesTimeOnTheServersClock(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Pool(t), pgtest.Schema(t)
	open := func(d time.Duration) *postgres.Journal {
		// Without liveness: the leases of owners that never registered
		// are judged by time alone, which is what is tested here.
		j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema), postgres.WithoutLiveness())
		require.NoError(t, err)
		t.Cleanup(func() { _ = j.Close() })
		require.NoError(t, postgres.SkewJournalClock(ctx, j, d))
		return j
	}
	right, ahead := open(0), open(skew)

	t.Run("a live lease is not lapsed to a clock that runs ahead", func(t *testing.T) {
		rec := newRecord("shop")
		rec.State = idem.StateInFlight
		rec.Lease = idem.Lease{Owner: "worker-1", ExpiresAt: time.Now().Add(15 * time.Second)}
		rec.ExpiresAt = time.Now().Add(24 * time.Hour)
		_, _, err := right.Create(ctx, rec)
		require.NoError(t, err)
		got, err := ahead.Claim(ctx, idem.ClaimRequest{Owner: "worker-2", Limit: 10, Lease: 15 * time.Second, Scope: "shop"})
		require.NoError(t, err)
		assert.Empty(t, got, "the worker whose clock is ahead claimed an operation under a live lease")
		_, err = ahead.Acquire(ctx, rec.Key, "worker-2", 15*time.Second)
		require.ErrorIs(t, err, idem.ErrLeased)

		seen, err := ahead.Get(ctx, rec.Key)
		require.NoError(t, err)
		assert.True(t, seen.ExpiresAt.After(time.Now().Add(skew+23*time.Hour)),
			"the retention reads on the reader's own clock: %s", seen.ExpiresAt)
		assert.True(t, seen.Lease.Held(time.Now().Add(skew)), "and so does the lease")
	})

	t.Run("a dead worker's lease lapses after its duration whatever its clock", func(t *testing.T) {
		rec := newRecord("farm")
		rec.State = idem.StateInFlight
		// Its worker's clock is an hour ahead, and it dies at once.
		rec.Lease = idem.Lease{Owner: "worker-3", ExpiresAt: time.Now().Add(skew + 500*time.Millisecond)}
		_, _, err := ahead.Create(ctx, rec)
		require.NoError(t, err)
		deadline := time.Now().Add(10 * time.Second)
		for {
			got, err := right.Claim(ctx, idem.ClaimRequest{Owner: "worker-4", Limit: 10, Lease: 15 * time.Second, Scope: "farm"})
			require.NoError(t, err)
			if len(got) == 1 {
				assert.Equal(t, rec.Key, got[0].Key)
				break
			}
			require.True(t, time.Now().Before(deadline),
				"the lease taken by a worker whose clock is an hour ahead is kept for that hour after it died")
			time.Sleep(50 * time.Millisecond)
		}
	})
}
