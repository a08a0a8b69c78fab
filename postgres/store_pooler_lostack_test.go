package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/postgres/internal/pgtest"
	"github.com/idemkit/idem/server"
)

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
	p, pool := poolBehindAProxiedPooler(t)
	schema := pgtest.Schema(t)
	s := openStoreIn(t, pool, schema)
	admin := pgtest.Pool(t)

	tx, err := admin.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctx, `LOCK TABLE `+pgx.Identifier{schema, "store_entries"}.Sanitize()+` IN SHARE MODE`)
	require.NoError(t, err)
	var pid int32
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))

	type result struct {
		res server.ClaimResult
		err error
	}
	done := make(chan result, 1)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	now := time.Now()
	go func() {
		res, err := s.Claim(cctx, claimAt("k", "fp", now))
		done <- result{res, err}
	}()
	var r result
	ended := false
	// waitFor waits until n statements of the store wait for the table,
	// or the claim ended.
	waitFor := func(n int) {
		for !ended && waitingStatements(t, admin, schema, pid) < n {
			select {
			case r = <-done:
				ended = true
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	waitFor(1) // the insert
	require.False(t, ended, "the claim ended before its insert waited for the table: %v", r.err)
	p.CutAll()
	waitFor(2) // the claim's insert again, behind the first
	require.NoError(t, tx.Rollback(ctx))
	if !ended {
		r = <-done
	}
	// The insert's server session runs on once the lock is gone: wait for
	// it to end its statement.
	for {
		var n int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE state = 'active' AND query LIKE '%' || $1 || '%' AND pid <> pg_backend_pid()`, schema).Scan(&n))
		if n == 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	e, err := openStoreIn(t, admin, schema).Get(ctx, "tenant", "k", now)
	t.Logf("claim: %+v, %v; entry: %+v, %v", r.res, r.err, e, err)
	if err != nil {
		return // the pooler's closing of the session aborted the insert: the claim's failure is right
	}
	require.NoError(t, r.err, "the insert committed: the key is this claim's")
	assert.True(t, r.res.Claimed)
	assert.Equal(t, e.Token, r.res.Token)
}
