package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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

// livenessPIDs are the server sessions that hold owner's liveness lock.
func livenessPIDs(t *testing.T, schema, owner string) []int32 {
	t.Helper()
	rows, err := pgtest.Pool(t).Query(ctx, livenessLocks(schema, "l.pid"), pgschema.Ident(schema)+".owners", owner)
	require.NoError(t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	return pids
}

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
	bouncer := pgtest.StartBouncer(t)
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

// TestLiveWorkerKeepsItsOperationAcrossAPoolerRestart: the PgBouncer in
// front of worker-a restarts while the server holds worker-a's request,
// ending every connection and server session it held, worker-a's
// liveness session among them. worker-a holds its lock again once the
// pooler is back, and worker-b (whose grace outlasts the restart) resumes
// and leaves the operation to it; worker-a's Do returns the server's 201.
func TestLiveWorkerKeepsItsOperationAcrossAPoolerRestart(t *testing.T) {
	t.Parallel()
	bouncer := pgtest.StartBouncer(t)
	g, srv := newGate(t)
	schema := pgtest.Schema(t)
	cfg, err := pgxpool.ParseConfig(bouncer.DSN())
	require.NoError(t, err)
	// As the README asks of a pool whose connections a restart may end.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return true }
	poolA, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(poolA.Close) // after the journal's Close, which gives back its session
	ja := openOn(t, poolA, schema)
	jb := openOn(t, pgtest.Pool(t), schema, postgres.LivenessGrace(time.Minute))
	a := workerClient(t, ja, srv, "worker-a")
	b := workerClient(t, jb, srv, "worker-b")
	before := livenessPIDs(t, schema, a.Owner())
	require.Len(t, before, 1)

	o := driveWhileOtherResumes(t, g, a, b, jb, func() {
		restarted := time.Now()
		bouncer.Restart()
		back := time.Now()
		waitLivenessHeld(t, schema, a.Owner())
		t.Logf("the pooler restarted in %v; worker-a held its lock again %v after it listened",
			back.Sub(restarted).Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
		assert.NotEqual(t, before, livenessPIDs(t, schema, a.Owner()), "worker-a's lock is held by a new server session")
	}, nil)
	checkKept(t, jb, srv, o, "worker-a")
}

// TestLiveWorkerBehindATransactionPoolerIsNotTakenWhileOthersRun:
// worker-a, behind the pooler with liveness, drives an operation while
// other clients of the same pooler run transactions on the pooler's two
// server sessions, and worker-b (LivenessGrace zero) resumes: worker-a
// is alive all along and keeps its operation.
func TestLiveWorkerBehindATransactionPoolerIsNotTakenWhileOthersRun(t *testing.T) {
	t.Parallel()
	bouncer := pgtest.StartBouncer(t)
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
	bouncer := pgtest.StartBouncer(t)
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
	bouncer := pgtest.StartBouncer(t)
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
	bouncer := pgtest.StartBouncer(t)
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

// TestLivenessTransactionOutlivesIdleInTransactionTimeout: the liveness
// lock is held in a transaction left open (so that a transaction pooler
// keeps its server session bound to the worker); a server that ends
// sessions idle in a transaction (idle_in_transaction_session_timeout, set
// here for the worker's sessions as a role or database setting would)
// ends an ordinary such session, never the liveness session.
func TestLivenessTransactionOutlivesIdleInTransactionTimeout(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	cfg, err := pgxpool.ParseConfig(pgtest.DSN())
	require.NoError(t, err)
	// Two seconds, not less: the journal's own short transactions on
	// these sessions (its migration, a claim) must not be cut on a busy
	// machine, only sessions left idle in a transaction.
	cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "2s"
	poolA, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer poolA.Close()
	b := openOn(t, pgtest.Pool(t), schema, postgres.LivenessGrace(0)) // migrates the schema
	a := openOn(t, poolA, schema)
	keys := createRecords(t, b, 1)
	unregister, err := a.Register(ctx, "worker-a")
	require.NoError(t, err)
	defer unregister()
	_, err = a.Acquire(ctx, keys[0], "worker-a", time.Hour)
	require.NoError(t, err)
	before := livenessPIDs(t, schema, "worker-a")
	require.Len(t, before, 1)

	// An ordinary session of the same settings, idle in a transaction
	// opened after the liveness one, is ended (a minute bounds a failing
	// run).
	other, err := pgx.ConnectConfig(ctx, cfg.ConnConfig.Copy())
	require.NoError(t, err)
	defer other.Close(ctx)
	_, err = other.Exec(ctx, `BEGIN`)
	require.NoError(t, err)
	pid := other.PgConn().PID()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		var n int
		require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n))
		if n == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "idle_in_transaction_session_timeout did not end a session in a minute")
	}
	assert.Equal(t, before, livenessPIDs(t, schema, "worker-a"), "the liveness session is the one it was")
	got, err := b.Claim(ctx, idem.ClaimRequest{Owner: "worker-b", Limit: 10, Lease: time.Hour})
	require.NoError(t, err)
	assert.Empty(t, got, "worker-a's operation is its own")
}
