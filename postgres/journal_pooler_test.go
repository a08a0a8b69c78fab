package postgres_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgschema"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// The tests of this file run workers behind a real PgBouncer in
// transaction pooling mode, which gives a client a server session for one
// transaction at a time and never says when it closes one.

// bouncerPool is a worker's pool through b.
func bouncerPool(t *testing.T, b *pgtest.Bouncer) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(ctx, b.DSN())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestLiveWorkerBehindATransactionPoolerKeepsItsOperation: worker-a's
// journal, opened with liveness, reaches the database through PgBouncer
// in transaction mode. The server session that holds its liveness lock
// ends (as when the pooler recycles it, the network between pooler and
// database fails, or an administrator ends it) while worker-a lives on:
// worker-a holds its lock again, and while its request is on the wire
// worker-b, whose LivenessGrace is zero, resumes and leaves it to
// worker-a, whose Do returns the server's 201.
func TestLiveWorkerBehindATransactionPoolerKeepsItsOperation(t *testing.T) {
	t.Parallel()
	bouncer := pgtest.StartBouncer(t, pgtest.BouncerConfig{})
	g, srv := newGate(t)
	schema := pgtest.Schema(t)
	ja := openOn(t, bouncerPool(t, bouncer), schema)
	jb := openOn(t, pgtest.Pool(t), schema, postgres.LivenessGrace(0))
	a := workerClient(t, ja, srv, "worker-a")
	b := workerClient(t, jb, srv, "worker-b")

	require.Equal(t, 1, terminateLiveness(t, schema, a.Owner()), "one server session holds worker-a's liveness lock")
	waitLivenessHeld(t, schema, a.Owner())
	o := driveWhileOtherResumes(t, g, a, b, jb, nil, nil)
	checkKept(t, jb, srv, o, "worker-a")
}

// TestLiveWorkerBehindATransactionPoolerIsNotTakenWhileOthersRun:
// worker-a, behind the pooler with liveness, drives an operation while
// other clients of the same pooler run transactions on the pooler's few
// server sessions, and worker-b (LivenessGrace zero) resumes: worker-a
// is alive all along and keeps its operation.
func TestLiveWorkerBehindATransactionPoolerIsNotTakenWhileOthersRun(t *testing.T) {
	t.Parallel()
	bouncer := pgtest.StartBouncer(t, pgtest.BouncerConfig{PoolSize: 2})
	g, srv := newGate(t)
	schema := pgtest.Schema(t)
	pool := bouncerPool(t, bouncer)
	ja := openOn(t, pool, schema)
	jb := openOn(t, pgtest.Pool(t), schema, postgres.LivenessGrace(0))
	a := workerClient(t, ja, srv, "worker-a")
	b := workerClient(t, jb, srv, "worker-b")

	// Other clients of the pooler: their transactions run on whichever
	// server session is free, the one that took worker-a's lock among
	// them.
	busy := openOn(t, bouncerPool(t, bouncer), schema, postgres.WithoutLiveness())
	createRecords(t, busy, 20)
	o := driveWhileOtherResumes(t, g, a, b, jb, func() { createRecords(t, busy, 20) }, nil)
	checkKept(t, jb, srv, o, "worker-a")
	assert.True(t, livenessHeld(t, schema, a.Owner()))
}

// TestKilledWorkerBehindATransactionPoolerIsTakenAtOnce: a worker process
// whose journal reaches the database through PgBouncer in transaction
// mode, with liveness, holds leases for an hour and is SIGKILLed; another
// worker takes its operations once the grace has passed, not when the
// pooler gets round to closing the server session its lock was taken on.
func TestKilledWorkerBehindATransactionPoolerIsTakenAtOnce(t *testing.T) {
	t.Parallel()
	bouncer := pgtest.StartBouncer(t, pgtest.BouncerConfig{})
	j := openJournal(t)
	keys := createRecords(t, j, 2)
	kill := startHolderWith(t, []string{"IDEM_TEST_POSTGRES=" + bouncer.DSN()}, j.Schema(), "worker-killed", time.Hour, true, keys...)

	unregister, err := j.Register(ctx, "worker-taker")
	require.NoError(t, err)
	defer unregister()
	recs, err := j.Claim(ctx, idem.ClaimRequest{Owner: "worker-taker", Limit: 10, Lease: time.Hour})
	require.NoError(t, err)
	assert.Empty(t, recs, "a live worker's operations are never taken")

	killed := time.Now()
	kill()
	got, at := claimUntil(t, j, "worker-taker", len(keys))
	t.Logf("the killed worker's %d operations were taken %v after SIGKILL, their leases had an hour to run", len(got), at.Sub(killed).Round(time.Millisecond))
	for _, rec := range got {
		evs, err := j.History(ctx, rec.Key)
		require.NoError(t, err)
		assert.Equal(t, "taken over from worker-killed: its owner is gone", evs[len(evs)-1].Detail)
	}
}

// TestClosedJournalBehindATransactionPoolerLetsGo: a worker behind the
// pooler that unregisters is gone at once: its lock is not left held by
// a server session of the pooler's.
func TestClosedJournalBehindATransactionPoolerLetsGo(t *testing.T) {
	t.Parallel()
	bouncer := pgtest.StartBouncer(t, pgtest.BouncerConfig{PoolSize: 2})
	schema := pgtest.Schema(t)
	ja := openOn(t, bouncerPool(t, bouncer), schema)
	jb := openOn(t, pgtest.Pool(t), schema)
	keys := createRecords(t, jb, 1)
	unregister, err := ja.Register(ctx, "worker-a")
	require.NoError(t, err)
	_, err = ja.Acquire(ctx, keys[0], "worker-a", time.Hour)
	require.NoError(t, err)
	require.NoError(t, unregister())

	assert.False(t, livenessHeld(t, schema, "worker-a"), "no session holds worker-a's liveness lock")
	got, err := jb.Claim(ctx, idem.ClaimRequest{Owner: "worker-b", Limit: 10, Lease: time.Hour})
	require.NoError(t, err)
	require.Len(t, got, 1, "worker-a's operation is taken at once")
}

// TestMixedFleetThroughATransactionPooler: worker-a reaches the database
// through PgBouncer in transaction mode and opens its journal
// WithoutLiveness, worker-b directly with liveness. worker-b, resuming
// while worker-a drives an operation, leaves it to worker-a.
func TestMixedFleetThroughATransactionPooler(t *testing.T) {
	t.Parallel()
	bouncer := pgtest.StartBouncer(t, pgtest.BouncerConfig{})
	g, srv := newGate(t)
	schema := pgtest.Schema(t)
	ja := openOn(t, bouncerPool(t, bouncer), schema, postgres.WithoutLiveness())
	jb := openOn(t, pgtest.Pool(t), schema, postgres.LivenessGrace(0))
	a := workerClient(t, ja, srv, "worker-a")
	b := workerClient(t, jb, srv, "worker-b")

	o := driveWhileOtherResumes(t, g, a, b, jb, nil, nil)
	checkKept(t, jb, srv, o, "worker-a")
	var n int
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM `+pgschema.Ident(schema)+`.owners
		WHERE starts_with(name, 'worker-a')`).Scan(&n))
	assert.Zero(t, n, "a journal WithoutLiveness records no owner")
}
