package storetest

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/server"
)

var claimTests = []test{
	{"NewKeyIsClaimedInProgress", func(t *testing.T, s server.Store) {
		res := mustClaim(t, s, claimAt("", "k1", "fp1", t0))
		assert.False(t, res.TookOver)
		e := mustGet(t, s, "", "k1", t0)
		assert.Equal(t, server.InProgress, e.State)
		assert.Equal(t, res.Token, e.Token)
		assert.Equal(t, "fp1", e.Fingerprint)
		assert.Equal(t, http.MethodPost, e.Method)
		assert.Equal(t, "/orders", e.Path)
		assertTime(t, t0, e.CreatedAt, "CreatedAt")
		assertTime(t, t0, e.LockedAt, "LockedAt")
		assertTime(t, t0.Add(retention), e.ExpiresAt, "ExpiresAt")
		assert.Nil(t, e.Response)
	}},
	{"SecondClaimWhileFreshSeesTheEntry", func(t *testing.T, s server.Store) {
		first := mustClaim(t, s, claimAt("", "k1", "fp1", t0))
		res, err := s.Claim(ctx, claimAt("", "k1", "fp1", t0.Add(lockTimeout/2)))
		require.NoError(t, err)
		assert.False(t, res.Claimed, "a fresh lock must not be claimed again")
		assert.False(t, res.TookOver)
		assert.Equal(t, server.InProgress, res.Entry.State)
		assert.Equal(t, first.Token, res.Entry.Token, "the existing entry is unchanged")
	}},
	{"OtherFingerprintSeesTheFirstRequest", func(t *testing.T, s server.Store) {
		mustClaim(t, s, claimAt("", "k1", "fp1", t0))
		req := claimAt("", "k1", "fp2", t0)
		req.Method, req.Path = http.MethodPatch, "/refunds"
		res, err := s.Claim(ctx, req)
		require.NoError(t, err)
		assert.False(t, res.Claimed)
		assert.Equal(t, "fp1", res.Entry.Fingerprint)
		assert.Equal(t, http.MethodPost, res.Entry.Method, "the entry names the route the key was first used on")
		assert.Equal(t, "/orders", res.Entry.Path)
	}},
	{"ClaimOfCompletedEntryReturnsItsResponse", func(t *testing.T, s server.Store) {
		c := mustClaim(t, s, claimAt("", "k1", "fp1", t0))
		want := response(`{"id":1}`)
		require.NoError(t, s.Complete(ctx, complete("", "k1", c.Token, want, t0)))
		res, err := s.Claim(ctx, claimAt("", "k1", "fp1", t0.Add(2*lockTimeout)))
		require.NoError(t, err)
		assert.False(t, res.Claimed, "a completed entry is never claimed again, however old its lock")
		assert.Equal(t, server.Completed, res.Entry.State)
		assertResponse(t, want, res.Entry.Response)
	}},
	{"StaleLockIsTakenOverWithANewToken", func(t *testing.T, s server.Store) {
		first := mustClaim(t, s, claimAt("", "k1", "fp1", t0))
		later := t0.Add(lockTimeout + 1)
		res := mustClaim(t, s, claimAt("", "k1", "fp1", later))
		assert.True(t, res.TookOver)
		assert.NotEqual(t, first.Token, res.Token, "a take-over must fence the previous holder off")
		e := mustGet(t, s, "", "k1", later)
		assert.Equal(t, res.Token, e.Token)
		assertTime(t, t0, e.CreatedAt, "a take-over keeps CreatedAt")
		assertTime(t, later, e.LockedAt, "a take-over moves LockedAt")
	}},
	{"LockExactlyAtStaleBeforeIsFresh", func(t *testing.T, s server.Store) {
		mustClaim(t, s, claimAt("", "k1", "fp1", t0))
		res, err := s.Claim(ctx, claimAt("", "k1", "fp1", t0.Add(lockTimeout)))
		require.NoError(t, err)
		assert.False(t, res.Claimed, "only a lock taken before StaleBefore is stale")
	}},
	{"StaleLockIsNotTakenOverWithAnotherFingerprint", func(t *testing.T, s server.Store) {
		first := mustClaim(t, s, claimAt("", "k1", "fp1", t0))
		res, err := s.Claim(ctx, claimAt("", "k1", "fp2", t0.Add(2*lockTimeout)))
		require.NoError(t, err)
		assert.False(t, res.Claimed, "another payload must never take a key over")
		assert.Equal(t, first.Token, res.Entry.Token)
		assert.Equal(t, "fp1", res.Entry.Fingerprint)
	}},
	{"CanceledContextClaimsNothing", func(t *testing.T, s server.Store) {
		cctx, cancel := contextCanceled()
		defer cancel()
		_, err := s.Claim(cctx, claimAt("", "k1", "fp1", t0))
		require.Error(t, err)
		requireAbsent(t, s, "", "k1", t0)
	}},
	{"LongAndQuotedKeys", func(t *testing.T, s server.Store) {
		long := strings.Repeat("k", 255)
		odd := `a "quoted" key, with \ and spaces`
		for _, k := range []string{long, odd} {
			mustClaim(t, s, claimAt("", k, "fp", t0))
			assert.Equal(t, k, mustGet(t, s, "", k, t0).Key)
		}
	}},
}
