package storetest

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/server"
)

func contextCanceled() (context.Context, context.CancelFunc) {
	c, cancel := context.WithCancel(context.Background())
	cancel()
	return c, cancel
}

var lifecycleTests = []test{
	{"CompleteStoresTheResponseByteForByte", func(t *testing.T, s server.Store) {
		c := mustClaim(t, s, claimAt("", "k1", "fp1", t0))
		want := response("binary \x00\xff\xfe body")
		done := t0.Add(5 * lockTimeout)
		require.NoError(t, s.Complete(ctx, complete("", "k1", c.Token, want, done)))
		e := mustGet(t, s, "", "k1", done)
		assert.Equal(t, server.Completed, e.State)
		assertResponse(t, want, e.Response)
		assertTime(t, done.Add(retention), e.ExpiresAt, "Complete sets ExpiresAt")
		assertTime(t, t0, e.CreatedAt, "CreatedAt")
	}},
	{"EmptyResponseRoundTrips", func(t *testing.T, s server.Store) {
		c := mustClaim(t, s, claimAt("", "k1", "fp1", t0))
		want := &server.StoredResponse{Status: http.StatusNoContent, Header: http.Header{}, Body: []byte{}}
		require.NoError(t, s.Complete(ctx, complete("", "k1", c.Token, want, t0)))
		got := mustGet(t, s, "", "k1", t0).Response
		require.NotNil(t, got)
		assert.Equal(t, http.StatusNoContent, got.Status)
		assert.Empty(t, got.Header)
		assert.Empty(t, got.Body)
		assert.NotNil(t, got.Body, "a stored body is never nil")
	}},
	{"CompleteWithAnotherTokenIsRefused", func(t *testing.T, s server.Store) {
		c := mustClaim(t, s, claimAt("", "k1", "fp1", t0))
		err := s.Complete(ctx, complete("", "k1", c.Token+1, response("x"), t0))
		require.ErrorIs(t, err, server.ErrLockLost)
		e := mustGet(t, s, "", "k1", t0)
		assert.Equal(t, server.InProgress, e.State, "a refused Complete changes nothing")
		assert.Nil(t, e.Response)
	}},
	{"CompleteTwiceIsRefused", func(t *testing.T, s server.Store) {
		c := mustClaim(t, s, claimAt("", "k1", "fp1", t0))
		first := response("first")
		require.NoError(t, s.Complete(ctx, complete("", "k1", c.Token, first, t0)))
		require.ErrorIs(t, s.Complete(ctx, complete("", "k1", c.Token, response("second"), t0)), server.ErrLockLost)
		assertResponse(t, first, mustGet(t, s, "", "k1", t0).Response)
	}},
	{"CompleteAgainWithTheSameTokenAndResponseSucceeds", func(t *testing.T, s server.Store) {
		// The middleware stores a response again when it could not tell
		// whether the first Complete was stored (its reply was lost): the
		// second finds its own completion and is no lost lock.
		c := mustClaim(t, s, claimAt("", "k1", "fp1", t0))
		want := &server.StoredResponse{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "X-Two": {"a", "b"}}, Body: []byte(`{"id":1}`)}
		require.NoError(t, s.Complete(ctx, complete("", "k1", c.Token, want, t0)))
		again := &server.StoredResponse{Status: 201, Header: http.Header{"X-Two": {"a", "b"}, "Content-Type": {"application/json"}}, Body: []byte(`{"id":1}`)}
		require.NoError(t, s.Complete(ctx, complete("", "k1", c.Token, again, t0.Add(time.Second))),
			"the same completion again, with the same token, succeeds")
		e := mustGet(t, s, "", "k1", t0)
		assert.Equal(t, server.Completed, e.State)
		assertResponse(t, want, e.Response)
		assertTime(t, t0.Add(retention), e.ExpiresAt, "the second Complete changed nothing")
		require.ErrorIs(t, s.Complete(ctx, complete("", "k1", c.Token, response("another"), t0)), server.ErrLockLost,
			"another response with the same token is refused")
		require.ErrorIs(t, s.Complete(ctx, complete("", "k1", c.Token+1, want, t0)), server.ErrLockLost,
			"the same response with another token is refused")
		assertResponse(t, want, mustGet(t, s, "", "k1", t0).Response)
	}},
	{"CompleteOfMissingEntryIsRefused", func(t *testing.T, s server.Store) {
		require.ErrorIs(t, s.Complete(ctx, complete("", "nope", 1, response("x"), t0)), server.ErrLockLost)
		requireAbsent(t, s, "", "nope", t0)
	}},
	{"FencedCompleteAfterTakeOverIsRefused", func(t *testing.T, s server.Store) {
		dead := mustClaim(t, s, claimAt("", "k1", "fp1", t0))
		later := t0.Add(2 * lockTimeout)
		taker := mustClaim(t, s, claimAt("", "k1", "fp1", later))
		require.True(t, taker.TookOver)
		// The presumed-dead holder wakes up and tries to store its answer.
		err := s.Complete(ctx, complete("", "k1", dead.Token, response("late"), later))
		require.ErrorIs(t, err, server.ErrLockLost)
		require.ErrorIs(t, s.Release(ctx, "", "k1", dead.Token), server.ErrLockLost)
		require.ErrorIs(t, s.Renew(ctx, "", "k1", dead.Token, later), server.ErrLockLost)
		assert.Equal(t, server.InProgress, mustGet(t, s, "", "k1", later).State, "the late holder changed nothing")
		want := response("taker")
		require.NoError(t, s.Complete(ctx, complete("", "k1", taker.Token, want, later)))
		assertResponse(t, want, mustGet(t, s, "", "k1", later).Response)
	}},
	{"ReleaseDeletesTheEntry", func(t *testing.T, s server.Store) {
		c := mustClaim(t, s, claimAt("", "k1", "fp1", t0))
		require.NoError(t, s.Release(ctx, "", "k1", c.Token))
		requireAbsent(t, s, "", "k1", t0)
		again := mustClaim(t, s, claimAt("", "k1", "fp2", t0))
		assert.False(t, again.TookOver)
		assert.NotEqual(t, c.Token, again.Token, "a released key claimed again must not hand out the old token")
		require.ErrorIs(t, s.Complete(ctx, complete("", "k1", c.Token, response("old"), t0)), server.ErrLockLost)
	}},
	{"ReleaseWithAnotherTokenIsRefused", func(t *testing.T, s server.Store) {
		c := mustClaim(t, s, claimAt("", "k1", "fp1", t0))
		require.ErrorIs(t, s.Release(ctx, "", "k1", c.Token+1), server.ErrLockLost)
		assert.Equal(t, c.Token, mustGet(t, s, "", "k1", t0).Token)
	}},
	{"ReleaseOfCompletedEntryIsRefused", func(t *testing.T, s server.Store) {
		c := mustClaim(t, s, claimAt("", "k1", "fp1", t0))
		require.NoError(t, s.Complete(ctx, complete("", "k1", c.Token, response("x"), t0)))
		require.ErrorIs(t, s.Release(ctx, "", "k1", c.Token), server.ErrLockLost)
		assert.Equal(t, server.Completed, mustGet(t, s, "", "k1", t0).State)
	}},
	{"RenewKeepsTheLockFresh", func(t *testing.T, s server.Store) {
		c := mustClaim(t, s, claimAt("", "k1", "fp1", t0))
		renewed := t0.Add(lockTimeout - 1)
		require.NoError(t, s.Renew(ctx, "", "k1", c.Token, renewed))
		assertTime(t, renewed, mustGet(t, s, "", "k1", renewed).LockedAt, "LockedAt after Renew")
		// Stale counted from the claim, fresh counted from the renewal.
		res, err := s.Claim(ctx, claimAt("", "k1", "fp1", t0.Add(lockTimeout+1)))
		require.NoError(t, err)
		assert.False(t, res.Claimed, "a renewed lock must not be taken over")
	}},
	{"RenewWithAnotherTokenOrAfterCompleteIsRefused", func(t *testing.T, s server.Store) {
		c := mustClaim(t, s, claimAt("", "k1", "fp1", t0))
		require.ErrorIs(t, s.Renew(ctx, "", "k1", c.Token+1, t0.Add(1)), server.ErrLockLost)
		assertTime(t, t0, mustGet(t, s, "", "k1", t0).LockedAt, "a refused Renew changes nothing")
		require.NoError(t, s.Complete(ctx, complete("", "k1", c.Token, response("x"), t0)))
		require.ErrorIs(t, s.Renew(ctx, "", "k1", c.Token, t0.Add(1)), server.ErrLockLost)
		require.ErrorIs(t, s.Renew(ctx, "", "nope", c.Token, t0.Add(1)), server.ErrLockLost)
	}},
	{"ReturnedEntriesAreCopies", func(t *testing.T, s server.Store) {
		c := mustClaim(t, s, claimAt("", "k1", "fp1", t0))
		resp := response("body")
		require.NoError(t, s.Complete(ctx, complete("", "k1", c.Token, resp, t0)))
		resp.Body[0] = 'X'
		resp.Header.Set("Content-Type", "changed")
		got := mustGet(t, s, "", "k1", t0).Response
		assert.Equal(t, "body", string(got.Body), "the store must not keep the caller's slice")
		got.Body[0] = 'Y'
		got.Header.Set("Content-Type", "changed")
		again := mustGet(t, s, "", "k1", t0).Response
		assert.Equal(t, "body", string(again.Body), "the store must not hand out its own slice")
		assert.Equal(t, "application/json", again.Header.Get("Content-Type"))
	}},
}
