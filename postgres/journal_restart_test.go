package postgres_test

import (
	"context"
	"syscall"
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

// checkedPool is a worker's pool on dsn that checks every connection
// before handing it out, as a pool must to come through a restart of the
// database without failing the first statement of each dead connection.
func checkedPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return true }
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// ownerLockHeld reports whether a session of the server holds owner's
// liveness lock in the journal's schema.
func ownerLockHeld(t *testing.T, pool *pgxpool.Pool, schema, owner string) bool {
	t.Helper()
	var n int
	err := pool.QueryRow(ctx, livenessLocks(schema, "count(*)"), pgschema.Ident(schema)+".owners", owner).Scan(&n)
	return err == nil && n > 0
}

// TestLiveWorkerKeepsItsOperationAcrossDatabaseRestart: the database
// crashes (pg_ctl stop -m immediate) and starts again while the server
// holds worker-a's request. worker-a takes its liveness lock again on a
// new session; worker-b, resuming after the restart, leaves the operation
// to worker-a, whose Do returns the server's 201.
func TestLiveWorkerKeepsItsOperationAcrossDatabaseRestart(t *testing.T) {
	t.Parallel()
	started := time.Now()
	db := pgtest.StartServer(t)
	t.Logf("a server of the test's own started in %v", time.Since(started).Round(time.Millisecond))
	g, srv := newGate(t)
	ja, err := postgres.OpenJournal(ctx, checkedPool(t, db.DSN()))
	require.NoError(t, err)
	defer ja.Close()
	jb, err := postgres.OpenJournal(ctx, checkedPool(t, db.DSN()))
	require.NoError(t, err)
	defer jb.Close()
	a := workerClient(t, ja, srv, "worker-a")
	b := workerClient(t, jb, srv, "worker-b")
	observer := checkedPool(t, db.DSN())

	o := driveWhileOtherResumes(t, g, a, b, jb, func() {
		require.True(t, ownerLockHeld(t, observer, ja.Schema(), a.Owner()))
		crashed := time.Now()
		db.Restart()
		up := time.Now()
		// The restart ended every session; worker-a's lock is back once
		// its journal has taken it on a new one (a minute bounds a failing
		// run, it is no measure).
		for deadline := time.Now().Add(time.Minute); !ownerLockHeld(t, observer, ja.Schema(), a.Owner()); time.Sleep(10 * time.Millisecond) {
			require.True(t, time.Now().Before(deadline), "worker-a's liveness lock is not held a minute after the restart")
		}
		t.Logf("the database was down %v; worker-a held its lock again %v after it was up",
			up.Sub(crashed).Round(time.Millisecond), time.Since(up).Round(time.Millisecond))
	}, nil)
	checkKept(t, jb, srv, o, "worker-a")
	assert.Contains(t, db.Log(), "database system was not properly shut down", "the server recovered from a crash")
}

// TestStalledWorkerIsNotTakenForDead: every session of worker-a's stalls
// (its backends stopped, as a network blip that loses nothing but delays
// everything would leave them) for longer than worker-b's LivenessGrace,
// while the server holds worker-a's request. The stalled liveness session
// still holds its lock: worker-b, resuming meanwhile, leaves the operation
// to worker-a, whose Do returns the 201 once the stall ends.
func TestStalledWorkerIsNotTakenForDead(t *testing.T) {
	t.Parallel()
	db := pgtest.StartServer(t)
	g, srv := newGate(t)
	cfg, err := pgxpool.ParseConfig(db.DSN())
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = "worker-a"
	poolA, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer poolA.Close()
	ja, err := postgres.OpenJournal(ctx, poolA)
	require.NoError(t, err)
	defer ja.Close()
	const grace = 100 * time.Millisecond
	jb, err := postgres.OpenJournal(ctx, checkedPool(t, db.DSN()), postgres.LivenessGrace(grace))
	require.NoError(t, err)
	defer jb.Close()
	a := workerClient(t, ja, srv, "worker-a")
	b := workerClient(t, jb, srv, "worker-b")
	observer := checkedPool(t, db.DSN())

	var stopped []int
	cont := func() {
		for _, pid := range stopped {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
		stopped = nil
	}
	t.Cleanup(cont)
	o := driveWhileOtherResumes(t, g, a, b, jb, func() {
		rows, err := observer.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = 'worker-a'`)
		require.NoError(t, err)
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		require.NoError(t, err)
		require.NotEmpty(t, pids)
		for _, pid := range pids {
			require.NoError(t, syscall.Kill(int(pid), syscall.SIGSTOP))
			stopped = append(stopped, int(pid))
		}
		// worker-b judges once the stall has lasted past its grace, and
		// twice: the first judgement of a free lock only marks it.
		time.Sleep(2 * grace)
		got, err := jb.Claim(ctx, idem.ClaimRequest{Owner: "worker-b-probe", Limit: 1, Lease: time.Hour})
		require.NoError(t, err)
		require.Empty(t, got, "a stalled worker is alive")
		time.Sleep(2 * grace)
	}, cont)
	checkKept(t, jb, srv, o, "worker-a")
}
