package postgres_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// TestJournalBehindAStatementPoolerSaysWhy: PgBouncer in statement mode
// refuses transactions, which the journal needs for its migrations and
// its writes. Opening it there fails with an error that says so and what
// to do, not with the pooler's words alone.
func TestJournalBehindAStatementPoolerSaysWhy(t *testing.T) {
	t.Parallel()
	bouncer := pgtest.StartBouncerWith(t, "pool_mode = statement")
	pool, err := pgxpool.New(ctx, bouncer.DSN())
	require.NoError(t, err)
	defer pool.Close()
	_, err = postgres.OpenJournal(ctx, pool, postgres.Schema(pgtest.Schema(t)), postgres.WithoutLiveness())
	require.Error(t, err)
	t.Logf("the error: %v", err)
	assert.Contains(t, err.Error(), "postgres journal in schema", "it names the journal")
	assert.Contains(t, err.Error(), "statement pooling mode")
	assert.Contains(t, err.Error(), "pool_mode = transaction", "it says what to use instead")
}

// TestPoolerPauseWithARegisteredWorker: PgBouncer's PAUSE (the first
// step of a switchover or a maintenance behind a pooler) waits until
// every server session is back in the pool, in transaction mode at the
// end of its transaction. A registered worker's liveness transaction
// ends only with the worker: PAUSE does not complete while one lives, and
// the README must say so.
func TestPoolerPauseWithARegisteredWorker(t *testing.T) {
	t.Parallel()
	bouncer := pgtest.StartBouncer(t)
	schema := pgtest.Schema(t)
	ja := openOn(t, bouncerPool(t, bouncer), schema)
	unregister, err := ja.Register(ctx, "worker-a")
	require.NoError(t, err)
	admin, err := pgx.Connect(ctx, strings.Replace(bouncer.DSN(), "/test?", "/pgbouncer?", 1)+"&default_query_exec_mode=simple_protocol")
	require.NoError(t, err)
	defer admin.Close(ctx)
	paused := make(chan error, 1)
	go func() { _, err := admin.Exec(ctx, "PAUSE"); paused <- err }()
	select {
	case err := <-paused:
		t.Fatalf("PAUSE completed while a worker is registered: %v", err)
	case <-time.After(3 * time.Second):
	}
	// It completes once the worker has unregistered.
	require.NoError(t, unregister())
	require.NoError(t, <-paused)
	_, err = admin.Exec(ctx, "RESUME")
	require.NoError(t, err)
}
