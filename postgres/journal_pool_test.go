package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testserver"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// smallPool is a pool of at most n connections.
func smallPool(t *testing.T, n int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN())
	require.NoError(t, err)
	cfg.MaxConns = n
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestRegisterLeavesTheJournalAConnection: each registration holds one of
// the pool's connections for its liveness session, for as long as it
// lives. A registration that would take the pool's last one is refused,
// saying so, instead of leaving every write of the journal to wait for a
// connection that never comes (a Do that hangs until its context ends), or
// a registration whose session ended to wait for one to take its lock
// again, until the others take it for dead.
func TestRegisterLeavesTheJournalAConnection(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)

	one := openOn(t, smallPool(t, 1), schema)
	_, err := one.Register(ctx, "alone")
	require.Error(t, err, "a registration on a pool of one connection leaves the journal none")
	assert.ErrorIs(t, err, postgres.ErrPoolTooSmall)
	assert.ErrorContains(t, err, "MaxConns")
	srv := testserver.Start(t)
	_, err = idem.New(idem.Config{Journal: one, BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.StatusURL), Owner: "w"})
	require.ErrorIs(t, err, postgres.ErrPoolTooSmall, "the client is refused at New, not left to hang in Do")
	assert.NotContains(t, owners(t, schema), "alone", "a refused registration records nothing")

	// Three connections: two registrations, and one left for the writes.
	three := openOn(t, smallPool(t, 3), schema)
	unA, err := three.Register(ctx, "a")
	require.NoError(t, err)
	defer unA()
	unB, err := three.Register(ctx, "b")
	require.NoError(t, err)
	_, err = three.Register(ctx, "c")
	require.ErrorIs(t, err, postgres.ErrPoolTooSmall)
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	rec, created, err := three.Create(dctx, newRecord("tenant"))
	require.NoError(t, err, "the journal writes with the connection left")
	require.True(t, created)
	// A registration that ended gives its connection back.
	require.NoError(t, unB())
	unC, err := three.Register(ctx, "c")
	require.NoError(t, err)
	defer unC()
	_, err = three.Acquire(dctx, rec.Key, "c", time.Hour)
	require.NoError(t, err)
}
