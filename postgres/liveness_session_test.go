package postgres_test

import (
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgproxy"
	"github.com/idemkit/idem/postgres/internal/pgschema"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// A worker's journal shares the application's pool (the README's
// "pgxpool.New(ctx, ...) // the application's pool"), sized as Register's
// doc asks: MaxConns above the number of clients registered through it
// (3 for 1). The application is busy: its queries hold the two other
// connections, and another waits for one. The worker's liveness session
// is ended (pg_terminate_backend) while it drives an operation the server
// holds. The docs: the journal "takes the lock again on a new session at
// once", and "a live worker is never taken for dead"; yet the slot the
// ended session frees goes to the application's waiting query, the
// journal queues behind it for a connection, and another worker's Resume,
// after its 2 s grace, takes the live worker's operation: its Do then
// fails after the server's 201. The liveness session competes with the
// application for the pool's connections; it needs one the application
// cannot take (a connection of its own, dialled from the pool's config,
// say).
func TestLiveWorkerKeepsItsOperationWhileTheApplicationUsesThePool(t *testing.T) {
	t.Parallel()
	g, srv := newGate(t)
	schema := pgtest.Schema(t)
	cfg, err := pgxpool.ParseConfig(pgtest.DSN())
	require.NoError(t, err)
	cfg.MaxConns = 3
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	ja := openOn(t, pool, schema)
	jb := openOn(t, pgtest.Pool(t), schema)
	a := workerClient(t, ja, srv, "worker-a")
	b := workerClient(t, jb, srv, "worker-b")

	var held []*pgxpool.Conn
	waiterDone := make(chan *pgxpool.Conn, 1)
	o := driveWhileOtherResumes(t, g, a, b, jb, func() {
		// The application's queries take every connection the journal
		// does not hold, and one more waits.
		for pool.Stat().TotalConns() < 3 || pool.Stat().IdleConns() > 0 {
			c, err := pool.Acquire(ctx)
			require.NoError(t, err)
			held = append(held, c)
		}
		go func() {
			c, err := pool.Acquire(ctx)
			if err != nil {
				c = nil
			}
			waiterDone <- c
		}()
		// Let the waiter queue first (were it late, the journal would get
		// the slot and the test would pass: it cannot fail spuriously).
		time.Sleep(50 * time.Millisecond)
		require.Equal(t, 1, terminateLiveness(t, schema, a.Owner()))
		// worker-b looks once, then again after its grace (2 s) has run,
		// while the application still holds its connections.
		_, err := b.Resume(ctx)
		require.NoError(t, err)
		time.Sleep(postgres.DefaultLivenessGrace + 500*time.Millisecond)
	}, func() {
		for _, c := range held {
			c.Release()
		}
		if c := <-waiterDone; c != nil {
			c.Release()
		}
	})
	checkKept(t, jb, srv, o, "worker-a")
}

// A NAT or firewall between a worker and its database forgets every
// connection of the worker at once (a restart of the middlebox, a table
// flush): each goes silent, its server side ended. New connections work.
// The README: "A liveness connection that goes silent ... the journal asks
// the server on the liveness session whenever it has idled for a quarter
// of the grace, and takes its lock again on a new session when no answer
// comes within as long"; the live worker keeps its operation. Here the
// pool's other connections, idle in the pool, went silent too. Found: the
// journal does not hold its lock again within the grace (2 s for both
// workers), worker-b takes the live worker's operation ("its owner is
// gone"), and worker-a's Do, whose outcome write waits some 45 s on a
// silent idle connection, ends in ErrOutcomeUnknown after the server's
// 201. With only the liveness connection silent (the same test otherwise)
// the worker keeps its operation: the lock is taken again through the
// pool's silent idle connections.
func TestLiveWorkerKeepsItsOperationWhenEveryConnectionGoesSilent(t *testing.T) {
	t.Parallel()
	g, srv := newGate(t)
	schema := pgtest.Schema(t)
	p, proxied := proxiedPool(t)
	// The application's pool pings a connection that idled before handing
	// it out (pgxpool's default), within a second (pool_ping_timeout, as
	// the README asks): without it the worker's own writes would wait on
	// the pool's silent connections until their context ends, whatever the
	// liveness session does.
	cfg := proxied.Config()
	cfg.PingTimeout = time.Second
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	ja := openOn(t, pool, schema)
	jb := openOn(t, pgtest.Pool(t), schema)
	a := workerClient(t, ja, srv, "worker-a")
	b := workerClient(t, jb, srv, "worker-b")

	o := driveWhileOtherResumes(t, g, a, b, jb, func() {
		// The pool holds idle connections, as a busy application's does.
		var conns []*pgxpool.Conn
		for range 3 {
			c, err := pool.Acquire(ctx)
			require.NoError(t, err)
			conns = append(conns, c)
		}
		for _, c := range conns {
			c.Release()
		}
		for _, pid := range p.BackendPIDs() {
			p.Blackhole(pid)
		}
		// As silence does: the cleanups' calls on the silent sessions
		// fail at once instead of waiting out their timeouts.
		t.Cleanup(p.CutAll)
		_, err := b.Resume(ctx)
		require.NoError(t, err)
		time.Sleep(postgres.DefaultLivenessGrace + 500*time.Millisecond)
	}, nil)
	checkKept(t, jb, srv, o, "worker-a")
}

// TestUnregisterDuringAPingEndsOnTheLivenessSession: the watcher asks the
// server now and then whether the liveness session is still there (an
// empty statement). Unregister landing while that question is out must
// still end the registration on the liveness session itself, the row and
// the lock in one commit, needing no connection of the pool: behind a
// PgBouncer that PAUSE holds, the pool has none to give, and an
// unregister that waited for one failed after ten seconds (CI, on
// TestPoolerPauseWithARegisteredWorker). Here the pool's only connection
// is the application's while the ping's answer is held in flight.
func TestUnregisterDuringAPingEndsOnTheLivenessSession(t *testing.T) {
	t.Parallel()
	p, pool := proxiedPoolOf(t, 1)
	// A grace of 8 s: the watcher pings after 2 s of quiet and gives the
	// answer 2 s, far more than the 200 ms it is held here.
	j := openOn(t, pool, pgtest.Schema(t), postgres.LivenessGrace(8*time.Second))
	unregister, err := j.Register(ctx, "worker-a")
	require.NoError(t, err)

	pinged := make(chan struct{})
	var once sync.Once
	p.DropReply(func(m pgproxy.Message) bool { // never fires: it only watches for the ping
		if m.Type == 'Q' && m.SQL == "" {
			once.Do(func() { close(pinged) })
		}
		return false
	})
	app, err := pool.Acquire(ctx) // the application holds the pool's one connection
	require.NoError(t, err)
	defer app.Release()
	p.Delay(time.Hour)
	<-pinged
	done := make(chan error, 1)
	go func() { done <- unregister() }()
	time.Sleep(200 * time.Millisecond) // unregister stops the watcher mid-ping
	p.Delay(0)
	require.NoError(t, <-done, "unregister ends the registration on its own session")

	var ended bool
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT ended_at IS NOT NULL FROM `+pgschema.Ident(j.Schema())+`.owners WHERE name = 'worker-a'`).Scan(&ended))
	require.True(t, ended, "the owner's row says it ended")
}
