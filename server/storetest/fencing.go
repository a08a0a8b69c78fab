package storetest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/server"
)

// fencingTests hold what the middleware's promise rests on when a lock is
// taken over: the taker gets a token no earlier holder of the key had, and
// nothing an earlier holder does afterwards changes the entry.
var fencingTests = []test{
	{"TakeOverBumpsTheToken", func(t *testing.T, s server.Store) {
		// Three holders in turn, each presumed dead by the next.
		var tokens []int64
		now := t0
		for i := range 3 {
			res := mustClaim(t, s, claimAt("", "k1", "fp1", now))
			assert.Equal(t, i > 0, res.TookOver)
			for _, old := range tokens {
				require.NotEqual(t, old, res.Token, "holder %d got the token of an earlier holder", i+1)
			}
			tokens = append(tokens, res.Token)
			now = now.Add(lockTimeout + 1)
		}
		current := tokens[len(tokens)-1]
		for _, old := range tokens[:len(tokens)-1] {
			require.ErrorIs(t, s.Renew(ctx, "", "k1", old, now), server.ErrLockLost, "an earlier holder cannot renew")
			require.ErrorIs(t, s.Release(ctx, "", "k1", old), server.ErrLockLost, "an earlier holder cannot release")
			require.ErrorIs(t, s.Complete(ctx, complete("", "k1", old, response("stale"), now)), server.ErrLockLost,
				"an earlier holder cannot complete")
		}
		e := mustGet(t, s, "", "k1", now)
		assert.Equal(t, current, e.Token)
		assert.Equal(t, server.InProgress, e.State)
		require.NoError(t, s.Renew(ctx, "", "k1", current, now), "the current holder still holds the lock")
	}},
	{"FencedCompleteLeavesTheTakersEntryAlone", func(t *testing.T, s server.Store) {
		dead := mustClaim(t, s, claimAt("", "k1", "fp1", t0))
		took := t0.Add(lockTimeout + 1)
		taker := mustClaim(t, s, claimAt("", "k1", "fp1", took))
		before := mustGet(t, s, "", "k1", took)

		// The presumed-dead holder comes back and stores its response.
		late := took.Add(lockTimeout / 2)
		require.ErrorIs(t, s.Complete(ctx, complete("", "k1", dead.Token, response("late"), late)), server.ErrLockLost)
		after := mustGet(t, s, "", "k1", late)
		assert.Equal(t, server.InProgress, after.State, "the refused Complete changed nothing")
		assert.Nil(t, after.Response)
		assert.Equal(t, taker.Token, after.Token)
		assertTime(t, before.LockedAt, after.LockedAt, "LockedAt")
		assertTime(t, before.ExpiresAt, after.ExpiresAt, "ExpiresAt")

		// The taker's lock is as fresh as before: it is not taken over, and
		// it stores its own response.
		res, err := s.Claim(ctx, claimAt("", "k1", "fp1", late))
		require.NoError(t, err)
		assert.False(t, res.Claimed, "the taker's fresh lock is not taken over")
		want := response("taker")
		require.NoError(t, s.Complete(ctx, complete("", "k1", taker.Token, want, late)))
		assertResponse(t, want, mustGet(t, s, "", "k1", late).Response)
	}},
}
