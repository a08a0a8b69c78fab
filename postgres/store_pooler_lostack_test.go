package postgres_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgproxy"
	"github.com/idemkit/idem/postgres/internal/pgtest"
	"github.com/idemkit/idem/server"
)

// storeBehindAProxiedPooler opens a store, in a schema of its own, on a
// pool that reaches the database through a proxy in front of PgBouncer in
// transaction mode, and the same store on a direct pool (admin).
func storeBehindAProxiedPooler(t *testing.T) (p *pgproxy.Proxy, s, direct *postgres.Store, admin *pgxpool.Pool, schema string) {
	t.Helper()
	p, pool := poolBehindAProxiedPooler(t)
	schema = pgtest.Schema(t)
	s = openStoreIn(t, pool, schema)
	admin = pgtest.Pool(t)
	return p, s, openStoreIn(t, admin, schema), admin, schema
}

// holdTable locks the store's table in SHARE mode, in a transaction of
// admin's (rolled back when the test ends): every write of the store waits.
// It returns the transaction and its server process.
func holdTable(t *testing.T, admin *pgxpool.Pool, schema string) (pgx.Tx, int32) {
	t.Helper()
	return holdIn(t, admin, `LOCK TABLE `+pgx.Identifier{schema, "store_entries"}.Sanitize()+` IN SHARE MODE`)
}

// holdRow locks the entry of key (in scope "tenant") FOR UPDATE: a write
// that changes it waits, an insert that runs into it does not.
func holdRow(t *testing.T, admin *pgxpool.Pool, schema, key string) (pgx.Tx, int32) {
	t.Helper()
	return holdIn(t, admin, `SELECT FROM `+pgx.Identifier{schema, "store_entries"}.Sanitize()+
		` WHERE scope = convert_to('tenant', 'UTF8') AND key = convert_to('`+key+`', 'UTF8') FOR UPDATE`)
}

func holdIn(t *testing.T, admin *pgxpool.Pool, sql string) (pgx.Tx, int32) {
	t.Helper()
	tx, err := admin.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	tag, err := tx.Exec(ctx, sql)
	require.NoError(t, err)
	if tag.Select() {
		require.EqualValues(t, 1, tag.RowsAffected(), "the row to hold")
	}
	var pid int32
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	return tx, pid
}

// inDoubtBehindThePooler runs call on its own goroutine, waits until one
// of its writes waits for the lock of the session pid, cuts the
// connections to the pooler (the write is in doubt), waits until a second
// write waits as well (the write run again) or call ended, lets the lock
// go (rollback), and returns call's error once call and every statement of
// the store's that ran on have ended.
func inDoubtBehindThePooler(t *testing.T, p *pgproxy.Proxy, admin *pgxpool.Pool, schema string, pid int32,
	rollback func(context.Context) error, call func(context.Context) error) error {
	t.Helper()
	done := make(chan error, 1)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	go func() { done <- call(cctx) }()
	var err error
	ended := false
	// waitFor waits until n statements of the store wait for the lock, or
	// call ended.
	waitFor := func(n int) {
		for !ended && waitingStatements(t, admin, schema, pid) < n {
			select {
			case err = <-done:
				ended = true
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	waitFor(1)
	require.False(t, ended, "the call ended before its write waited for the lock: %v", err)
	p.CutAll()
	waitFor(2)
	require.NoError(t, rollback(ctx))
	if !ended {
		err = <-done
	}
	// The first write's server session runs on once the lock is gone: wait
	// for it to end its statement.
	for {
		var n int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE state = 'active' AND query LIKE '%' || $1 || '%' AND pid <> pg_backend_pid()`, schema).Scan(&n))
		if n == 0 {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestClaimWhoseInsertIsInDoubtBehindATransactionPooler: the store reaches
// the database through PgBouncer in transaction mode (and a proxy that
// cuts the connection). A claim's insert waits for the table, which
// another session locked, and the connection to the pooler is cut: the
// insert is in doubt. Behind a pooler its server session cannot be found
// and waited for, so the read-back reads at once and finds nothing. Once
// the other session lets go, the insert, which the server had whole,
// commits: the key is this claim's. The claim must say so (or at least
// not that its insert was not committed, which leaves a key locked by
// nobody until its lock is stale).
func TestClaimWhoseInsertIsInDoubtBehindATransactionPooler(t *testing.T) {
	t.Parallel()
	p, s, direct, admin, schema := storeBehindAProxiedPooler(t)
	tx, pid := holdTable(t, admin, schema)
	now := time.Now()
	var res server.ClaimResult
	err := inDoubtBehindThePooler(t, p, admin, schema, pid, tx.Rollback, func(ctx context.Context) (err error) {
		res, err = s.Claim(ctx, claimAt("k", "fp", now))
		return err
	})
	e, gerr := direct.Get(ctx, "tenant", "k", now)
	t.Logf("claim: %+v, %v; entry: %+v, %v", res, err, e, gerr)
	if gerr != nil {
		// The pooler's closing of the session aborted the insert: the
		// claim's failure is right.
		require.ErrorIs(t, gerr, server.ErrNotFound)
		assert.Error(t, err)
		return
	}
	require.NoError(t, err, "the insert committed: the key is this claim's")
	assert.True(t, res.Claimed)
	assert.Equal(t, e.Token, res.Token)
}

// TestClaimWhoseReplacementIsInDoubtBehindATransactionPooler: as the
// insert's test above, for the claim of a key whose entry is in its way,
// expired (replaced) or locked by a handler gone stale (taken over). The
// claim's insert runs into the row, and its replacement or take-over
// waits for the row, which another session holds; the connection is cut,
// the read-back (at once, behind the pooler) finds the old entry, and the
// claim looks again: its write run again waits behind the first, which
// then commits, and the claim finds the entry its first write made. It
// must take it as its own, not answer that the key is held by another
// request (a 409 for the request, whose key nobody then holds until its
// lock is stale).
func TestClaimWhoseReplacementIsInDoubtBehindATransactionPooler(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for name, before := range map[string]server.ClaimRequest{
		"expired": {Scope: "tenant", Key: "k", Fingerprint: "other", Method: "POST", Path: "/orders",
			Now: now.Add(-2 * time.Hour), ExpiresAt: now.Add(-time.Hour), StaleBefore: now.Add(-3 * time.Hour)},
		"stale": claimAt("k", "fp", now.Add(-2*time.Minute)),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p, s, direct, admin, schema := storeBehindAProxiedPooler(t)
			old, err := direct.Claim(ctx, before)
			require.NoError(t, err)
			require.True(t, old.Claimed)
			tx, pid := holdRow(t, admin, schema, "k")
			var res server.ClaimResult
			err = inDoubtBehindThePooler(t, p, admin, schema, pid, tx.Rollback, func(ctx context.Context) (err error) {
				res, err = s.Claim(ctx, claimAt("k", "fp", now))
				return err
			})
			e, gerr := direct.Get(ctx, "tenant", "k", now)
			t.Logf("claim: %+v, %v; entry: %+v, %v", res, err, e, gerr)
			require.NoError(t, gerr)
			if e.Token == old.Token {
				// Neither write committed: the claim cannot have claimed.
				assert.False(t, err == nil && res.Claimed, "claimed an entry it did not write")
				return
			}
			// The entry was claimed at the claim's time: by its first
			// write or by the write run again, and either is the claim's.
			require.True(t, e.LockedAt.Equal(now), "claimed by nobody else")
			require.NoError(t, err, "the key is this claim's")
			assert.True(t, res.Claimed, "the key is this claim's, not another request's")
			assert.Equal(t, e.Token, res.Token)
			assert.Equal(t, name == "stale", res.TookOver, "a take-over says so")
		})
	}
}

// TestCompletionWhoseCommitIsInDoubtBehindATransactionPooler: a handler's
// completion waits for the entry's row, which another session holds, and
// the connection to the pooler is cut: the completion is in doubt. The
// read-back (at once, behind the pooler) finds the entry still in
// progress. Once the other session lets go, the completion, which the
// server had whole, commits: the response is stored, and a retry replays
// it. Complete must then succeed, not fail the request with a 5xx for an
// effect that happened (and is replayed).
func TestCompletionWhoseCommitIsInDoubtBehindATransactionPooler(t *testing.T) {
	t.Parallel()
	p, s, direct, admin, schema := storeBehindAProxiedPooler(t)
	now := time.Now()
	c, err := direct.Claim(ctx, claimAt("k", "fp", now))
	require.NoError(t, err)
	require.True(t, c.Claimed)
	tx, pid := holdRow(t, admin, schema, "k")
	err = inDoubtBehindThePooler(t, p, admin, schema, pid, tx.Rollback, func(ctx context.Context) error {
		return s.Complete(ctx, server.CompleteRequest{Scope: "tenant", Key: "k", Token: c.Token,
			Response:  &server.StoredResponse{Status: http.StatusCreated, Header: http.Header{}, Body: []byte("order 1")},
			ExpiresAt: now.Add(24 * time.Hour)})
	})
	e, gerr := direct.Get(ctx, "tenant", "k", now)
	t.Logf("complete: %v; entry: %+v, %v", err, e, gerr)
	require.NoError(t, gerr)
	if e.State != server.Completed {
		// Neither write committed: the completion's failure is right.
		assert.Error(t, err)
		return
	}
	require.Equal(t, c.Token, e.Token)
	require.Equal(t, http.StatusCreated, e.Response.Status)
	assert.NoError(t, err, "the response is stored (and a retry replays it): the completion succeeded")
}

// TestRenewalWhoseCommitIsInDoubtBehindATransactionPooler: a running
// handler's lock renewal waits for the entry's row, which another session
// holds, and the connection to the pooler is cut: the renewal is in
// doubt. It changes nothing when run twice: run again, it waits for the
// first (behind the pooler the first's session cannot be waited for) and
// renews the lock whether the first committed or not. It must not fail
// (a failed renewal is a renewal missed: the handler is told to stop
// once two are).
func TestRenewalWhoseCommitIsInDoubtBehindATransactionPooler(t *testing.T) {
	t.Parallel()
	p, s, direct, admin, schema := storeBehindAProxiedPooler(t)
	now := time.Now()
	c, err := direct.Claim(ctx, claimAt("k", "fp", now))
	require.NoError(t, err)
	require.True(t, c.Claimed)
	tx, pid := holdRow(t, admin, schema, "k")
	later := now.Add(10 * time.Second)
	err = inDoubtBehindThePooler(t, p, admin, schema, pid, tx.Rollback, func(ctx context.Context) error {
		return s.Renew(ctx, "tenant", "k", c.Token, later)
	})
	e, gerr := direct.Get(ctx, "tenant", "k", now)
	t.Logf("renew: %v; entry: %+v, %v", err, e, gerr)
	require.NoError(t, gerr)
	if !e.LockedAt.Equal(later) {
		// Neither write committed: the renewal's failure is right.
		assert.Error(t, err)
		return
	}
	assert.NoError(t, err, "the lock is renewed: the renewal succeeded")
}

// TestReleaseWhoseCommitIsInDoubtBehindATransactionPooler: as the
// renewal's test, for the release of a key whose handler failed (the key
// left for a retry to run again). The release, in doubt, then commits:
// the key is released, and Release must say so, not that it was not (the
// middleware logs an error saying the key is retryable only once its lock
// is stale).
func TestReleaseWhoseCommitIsInDoubtBehindATransactionPooler(t *testing.T) {
	t.Parallel()
	p, s, direct, admin, schema := storeBehindAProxiedPooler(t)
	now := time.Now()
	c, err := direct.Claim(ctx, claimAt("k", "fp", now))
	require.NoError(t, err)
	require.True(t, c.Claimed)
	tx, pid := holdRow(t, admin, schema, "k")
	err = inDoubtBehindThePooler(t, p, admin, schema, pid, tx.Rollback, func(ctx context.Context) error {
		return s.Release(ctx, "tenant", "k", c.Token)
	})
	e, gerr := direct.Get(ctx, "tenant", "k", now)
	t.Logf("release: %v; entry: %+v, %v", err, e, gerr)
	if gerr == nil {
		// Neither write committed: the release's failure is right.
		assert.Error(t, err)
		return
	}
	require.ErrorIs(t, gerr, server.ErrNotFound)
	assert.NoError(t, err, "the key is released: the release succeeded")
}
