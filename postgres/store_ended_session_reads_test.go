package postgres_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// storeWithAnEntry opens a store on pool in schema, claims a key in it,
// and leaves all of the pool's sessions idle, as between two requests.
func storeWithAnEntry(t *testing.T, pool *pgxpool.Pool, schema string) (*postgres.Store, time.Time) {
	t.Helper()
	s := openStoreIn(t, pool, schema)
	now := time.Now()
	res, err := s.Claim(ctx, claimAt("k", "fp", now))
	require.NoError(t, err)
	require.True(t, res.Claimed)
	warmSessions(t, pool, int(pool.Config().MaxConns))
	return s, now
}

// The status endpoint's read (Get) after an administrator, or a reaper of
// idle sessions, terminated the store pool's idle sessions (57P01): a read
// changes nothing, and runs again on another session, as the journal's
// do, instead of failing the request with a 5xx while the database is up.
func TestStoreReadAfterTheServerTerminatedThePoolsIdleSessions(t *testing.T) {
	t.Parallel()
	db := poolWithDefaults(t, "role", 3, nil)
	s, now := storeWithAnEntry(t, db.pool, "idem")
	ended := terminateSessions(t, db)
	e, err := s.Get(ctx, "tenant", "k", now)
	require.NoError(t, err, "a store Get after the pool's %d idle sessions were terminated", ended)
	assert.Equal(t, "fp", e.Fingerprint)
}

// The network cut every idle session of the store's pool (the pool's
// one-second check before use has not run yet): the status endpoint's
// read meets a broken connection, and runs again on another.
func TestStoreReadAfterThePoolsIdleSessionsWereCut(t *testing.T) {
	t.Parallel()
	p, pool := proxiedPool(t)
	s, now := storeWithAnEntry(t, pool, pgtest.Schema(t))
	p.CutAll()
	e, err := s.Get(ctx, "tenant", "k", now)
	require.NoError(t, err, "a store Get after the pool's idle sessions were cut")
	assert.Equal(t, "fp", e.Fingerprint)
}
