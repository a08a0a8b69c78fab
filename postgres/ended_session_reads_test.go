package postgres_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// warmSessions makes the pool hold n sessions of its own, all idle.
func warmSessions(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	var conns []*pgxpool.Conn
	for range n {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
}

// terminateSessions ends every session of db's role but the admin's own
// with pg_terminate_backend, as an administrator or a reaper of idle
// sessions would, and returns how many it ended.
func terminateSessions(t *testing.T, db *defaultsDB) int {
	t.Helper()
	var ended int
	require.NoError(t, db.admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity
		WHERE usename = $1 AND pid <> pg_backend_pid()`, db.name).Scan(&ended))
	require.NotZero(t, ended)
	return ended
}

// Every idle session of the pool ended for idling (57P05): a read meets
// one ended session after another, and runs again each time until it
// finds a live one (a new connection). A List read page by page by a
// consumer that idles between the pages meets an ended session at each
// page. A guard: held when written.
func TestReadsMeetOneSessionEndedForIdlingAfterAnother(t *testing.T) {
	t.Parallel()
	const idle = 600 * time.Millisecond // past the 200 ms timeout, within pgxpool's second
	db := poolWithDefaults(t, "role", 3, map[string]string{"idle_session_timeout": "200ms"})
	w := openOn(t, db.pool, "idem")
	keys := createRecords(t, w, 2*256+1) // three of List's pages
	warmSessions(t, db.pool, 3)
	time.Sleep(idle)
	_, err := w.Get(ctx, keys[0])
	require.NoError(t, err, "a Get whose pool holds only sessions ended for idling")

	n := 0
	for _, err := range w.List(ctx, idem.Filter{}) {
		require.NoError(t, err, "List, record %d, its consumer idling between pages", n)
		n++
		if n%256 == 0 {
			warmSessions(t, db.pool, 3)
			time.Sleep(idle)
		}
	}
	assert.Equal(t, len(keys), n)
}

// An administrator (or a tool that reaps idle sessions) ends the pool's
// idle sessions with pg_terminate_backend: the server says so with 57P01,
// not 57P05, on the next statement of each, which none of that statement
// ran, just as for a session ended for idling. A read is safe to run
// again whatever ended its session; onLiveSession retries only 57P05, so
// the first read after the reaping fails its caller (Get, and so Lookup
// and Resume's reads) while the database is up and a new session would
// answer. Correct: the read runs again on another session. (Not a
// regression of fd48670: reads failed so before it too.)
func TestReadAfterTheServerTerminatedThePoolsIdleSessions(t *testing.T) {
	t.Parallel()
	db := poolWithDefaults(t, "role", 3, nil)
	w := openOn(t, db.pool, "idem")
	keys := createRecords(t, w, 1)
	warmSessions(t, db.pool, 3)
	ended := terminateSessions(t, db)
	_, err := w.Get(ctx, keys[0])
	assert.NoError(t, err, "a Get after the pool's %d idle sessions were terminated", ended)
}

// The network cut every session of the pool while they idled (the pool's
// one-second check before use has not run yet): a read meets a broken
// connection, and, a read changing nothing, runs again on another.
func TestReadAfterThePoolsIdleSessionsWereCut(t *testing.T) {
	t.Parallel()
	p, pool := proxiedPool(t)
	w := openOn(t, pool, pgtest.Schema(t))
	keys := createRecords(t, w, 1)
	warmSessions(t, pool, int(pool.Config().MaxConns))
	p.CutAll()
	_, err := w.Get(ctx, keys[0])
	assert.NoError(t, err, "a Get after the pool's idle sessions were cut")
}
