package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgproxy"
	"github.com/idemkit/idem/postgres/internal/pgtest"
	"github.com/idemkit/idem/server"
)

// slowCommit makes every commit that wrote to table of schema take a
// while, as a commit waiting for its WAL flush or a synchronous standby
// does: a deferred constraint trigger runs at COMMIT and sleeps.
func slowCommit(t *testing.T, schema, table string) {
	t.Helper()
	pool := pgtest.Pool(t)
	_, err := pool.Exec(ctx, fmt.Sprintf(`
		CREATE FUNCTION %[1]q.slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(1.5); RETURN NULL; END $$;
		CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT OR UPDATE ON %[1]q.%[2]q
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION %[1]q.slow_commit()`, schema, table))
	require.NoError(t, err)
}

// cutWhileCommitting cuts every session of p once a commit of schema's
// database sleeps in slowCommit: the client loses the connection while the
// server still runs the commit, which then completes.
func cutWhileCommitting(t *testing.T, p *pgproxy.Proxy, direct *pgxpool.Pool) <-chan bool {
	return cutWhileWaiting(p, direct, "PgSleep")
}

// cutWhileWaiting cuts every session of p once a session of direct's
// database waits on event.
func cutWhileWaiting(p *pgproxy.Proxy, direct *pgxpool.Pool, event string) <-chan bool {
	cut := make(chan bool, 1)
	go func() {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			var n int
			if err := direct.QueryRow(context.Background(),
				`SELECT count(*) FROM pg_stat_activity WHERE wait_event = $1 AND datname = current_database() AND pid <> pg_backend_pid()`, event).Scan(&n); err == nil && n > 0 {
				p.CutAll()
				cut <- true
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		cut <- false
	}()
	return cut
}

// A create whose connection is cut while its COMMIT still runs on the
// server (behind a proxy or pooler, where the journal cannot find the
// session to wait for): the commit completes after the read-back. The
// create is the caller's: it must not be reported as an operation that
// existed before (created false), nor fail as if nothing were committed.
func TestJournalCreateCutWhileItsCommitStillRuns(t *testing.T) {
	t.Parallel()
	p, pool := proxiedPool(t)
	schema := pgtest.Schema(t)
	j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema))
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	slowCommit(t, schema, "operations")
	cut := cutWhileCommitting(t, p, pgtest.Pool(t))

	rec := newRecord("shop")
	got, created, err := j.Create(ctx, rec)
	require.True(t, <-cut, "the commit was never seen running")
	t.Logf("Create: created=%v version=%d err=%v", created, got.Version, err)
	if err == nil {
		assert.True(t, created, "the record is this call's create; created=false tells Do another call made it")
	}
}

// The store's claim whose connection is cut while its COMMIT still runs on
// the server: the key must be this request's (Claimed), or an error; never
// an answer that the key is held by another request.
func TestStoreClaimCutWhileItsCommitStillRuns(t *testing.T) {
	t.Parallel()
	p, pool := proxiedPool(t)
	schema := pgtest.Schema(t)
	s := openStoreIn(t, pool, schema)
	slowCommit(t, schema, "store_entries")
	cut := cutWhileCommitting(t, p, pgtest.Pool(t))

	res, err := s.Claim(ctx, claimAt("k1", "fp", time.Now()))
	require.True(t, <-cut, "the commit was never seen running")
	t.Logf("Claim: %+v err=%v", res, err)
	if err == nil {
		assert.True(t, res.Claimed, "the key was claimed by this very call; it must not be reported as another request's")
		return
	}
	// The call said what it knows; it must be true once the commit ends.
	direct := openStoreIn(t, pgtest.Pool(t), schema)
	require.Eventually(t, func() bool {
		var n int
		return pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND datname = current_database()`).Scan(&n) == nil && n == 0
	}, 10*time.Second, 20*time.Millisecond)
	e, gerr := direct.Get(ctx, "tenant", "k1", time.Now())
	t.Logf("after the commit ended: entry %+v err=%v", e.State, gerr)
	if errors.Is(gerr, server.ErrNotFound) {
		return
	}
	assert.NotContains(t, err.Error(), "it was not committed", "the claim reported as not committed is in the store: %+v", e)
}
