package storetest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/server"
)

var scopeTests = []test{
	{"SameKeyInTwoScopesIsTwoEntries", func(t *testing.T, s server.Store) {
		a := mustClaim(t, s, claimAt("tenant-a", "k1", "fp-a", t0))
		b := mustClaim(t, s, claimAt("tenant-b", "k1", "fp-b", t0))
		assert.NotEqual(t, a.Token, b.Token)
		ra, rb := response("for a"), response("for b")
		require.NoError(t, s.Complete(ctx, complete("tenant-a", "k1", a.Token, ra, t0)))
		assert.Equal(t, server.InProgress, mustGet(t, s, "tenant-b", "k1", t0).State, "completing a's entry leaves b's alone")
		require.NoError(t, s.Complete(ctx, complete("tenant-b", "k1", b.Token, rb, t0)))
		assertResponse(t, ra, mustGet(t, s, "tenant-a", "k1", t0).Response)
		assertResponse(t, rb, mustGet(t, s, "tenant-b", "k1", t0).Response)
	}},
	{"AnEntryIsInvisibleFromAnotherScope", func(t *testing.T, s server.Store) {
		mustClaim(t, s, claimAt("tenant-a", "k1", "fp", t0))
		requireAbsent(t, s, "tenant-b", "k1", t0)
		requireAbsent(t, s, "", "k1", t0)
	}},
	{"TokensDoNotCrossScopes", func(t *testing.T, s server.Store) {
		a := mustClaim(t, s, claimAt("tenant-a", "k1", "fp", t0))
		mustClaim(t, s, claimAt("tenant-b", "k1", "fp", t0))
		require.ErrorIs(t, s.Complete(ctx, complete("tenant-c", "k1", a.Token, response("x"), t0)), server.ErrLockLost)
		require.ErrorIs(t, s.Release(ctx, "tenant-c", "k1", a.Token), server.ErrLockLost)
		assert.Equal(t, server.InProgress, mustGet(t, s, "tenant-a", "k1", t0).State)
	}},
	{"ScopeAndKeyDoNotRunTogether", func(t *testing.T, s server.Store) {
		// A store that joined scope and key into one string without a
		// separator would confuse these two.
		mustClaim(t, s, claimAt("ab", "c", "fp1", t0))
		mustClaim(t, s, claimAt("a", "bc", "fp2", t0))
		assert.Equal(t, "fp1", mustGet(t, s, "ab", "c", t0).Fingerprint)
		assert.Equal(t, "fp2", mustGet(t, s, "a", "bc", t0).Fingerprint)
	}},
}
