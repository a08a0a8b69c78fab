package postgres_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testserver"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgschema"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// The tests of this file are about a worker that lives on while something
// happens to its liveness session, seen through the public API: a worker
// drives an operation whose request the server holds, another worker
// resumes, and the first must keep its operation.

// gate holds every order that reaches the server until it is opened.
type gate struct {
	arrived chan string // the key of each order held
	open    chan struct{}
	once    sync.Once
}

func newGate(t *testing.T) (*gate, *testserver.Server) {
	g := &gate{arrived: make(chan string, 16), open: make(chan struct{})}
	srv := testserver.Start(t, testserver.WithWrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost {
				g.arrived <- r.Header.Get("Idempotency-Key")
				select {
				case <-g.open:
				case <-r.Context().Done():
				}
			}
			next.ServeHTTP(w, r)
		})
	}))
	t.Cleanup(g.release) // before the server closes, which waits for held requests
	return g, srv
}

func (g *gate) release() { g.once.Do(func() { close(g.open) }) }

// held waits for an order to reach the server and returns its key.
func (g *gate) held(t *testing.T) string {
	t.Helper()
	select {
	case k := <-g.arrived:
		return k
	case <-time.After(time.Minute):
		t.Fatal("no order reached the server in a minute")
		return ""
	}
}

// workerClient is one worker's client: it registers owner with j.
func workerClient(t *testing.T, j idem.Journal, srv *testserver.Server, owner string) *idem.Client {
	t.Helper()
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.StatusURL),
		Owner: owner, AttemptTimeout: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// workerPool is a worker's own pool, as a process of its own would have.
// While refuse is set it makes no new connection and hands out none of
// those it has: the worker is cut off from the database, its sessions
// there live on.
func workerPool(t *testing.T, refuse *atomic.Bool) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN())
	require.NoError(t, err)
	cfg.BeforeConnect = func(context.Context, *pgx.ConnConfig) error {
		if refuse.Load() {
			return errors.New("the test cuts this worker off from the database")
		}
		return nil
	}
	cfg.PrepareConn = func(context.Context, *pgx.Conn) (bool, error) {
		if refuse.Load() {
			return false, errors.New("the test cuts this worker off from the database")
		}
		return true, nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func openOn(t *testing.T, pool *pgxpool.Pool, schema string, opts ...postgres.Option) *postgres.Journal {
	t.Helper()
	j, err := postgres.OpenJournal(ctx, pool, append([]postgres.Option{postgres.Schema(schema)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	return j
}

// livenessLocks is the statement that finds the sessions holding an
// owner's liveness lock ($1 the schema's owners table, $2 the owner).
func livenessLocks(schema, what string) string {
	return `SELECT ` + what + ` FROM pg_locks l JOIN ` + pgschema.Ident(schema) + `.owners o ON l.objid = o.id::oid
		WHERE l.locktype = 'advisory' AND l.classid = $1::regclass::oid AND l.objsubid = 2 AND l.granted
		AND o.name = $2 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`
}

// terminateLiveness ends the session that holds owner's liveness lock, as
// an administrator's pg_terminate_backend would, waits until it has ended,
// and returns how many sessions it ended.
func terminateLiveness(t *testing.T, schema, owner string) int {
	t.Helper()
	pids := livenessPIDs(t, schema, owner)
	for _, pid := range pids {
		var ok bool
		require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&ok))
		require.True(t, ok, "terminating backend %d", pid)
	}
	// pg_terminate_backend signals; the backend lets go of its locks as it exits.
	deadline := time.Now().Add(time.Minute)
	for {
		var left int
		require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, pids).Scan(&left))
		if left == 0 {
			return len(pids)
		}
		require.True(t, time.Now().Before(deadline), "terminated backends still run after a minute")
		time.Sleep(5 * time.Millisecond)
	}
}

// livenessHeld reports whether a session holds owner's liveness lock.
func livenessHeld(t *testing.T, schema, owner string) bool {
	t.Helper()
	var n int
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, livenessLocks(schema, "count(*)"),
		pgschema.Ident(schema)+".owners", owner).Scan(&n))
	return n > 0
}

// waitLivenessHeld waits until a session holds owner's liveness lock (a
// minute bounds a failing run; it is no measure).
func waitLivenessHeld(t *testing.T, schema, owner string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !livenessHeld(t, schema, owner) {
		require.True(t, time.Now().Before(deadline), "%s's liveness lock is not held again after a minute", owner)
		time.Sleep(10 * time.Millisecond)
	}
}

// heldOrder is what became of one order that a worker drove while another
// resumed.
type heldOrder struct {
	key     string
	res     *idem.Result
	err     error // the driving worker's Do's
	taken   bool  // the resuming worker took the operation over
	resumed idem.ResumeReport
}

// driveWhileOtherResumes has a drive an order, which the server holds;
// while it is held, whileHeld runs, then b resumes, then beforeRelease
// runs, and the server answers. It returns when both have returned.
func driveWhileOtherResumes(t *testing.T, g *gate, a, b *idem.Client, jb idem.Journal, whileHeld, beforeRelease func()) heldOrder {
	t.Helper()
	type done struct {
		res *idem.Result
		err error
	}
	doneA := make(chan done, 1)
	go func() {
		res, err := a.Do(ctx, idem.Op{ID: "order-" + uuid.NewString(), Method: http.MethodPost, URL: "/orders",
			Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"item":"book","quantity":1}`)})
		doneA <- done{res, err}
	}()
	out := heldOrder{key: g.held(t)}
	if whileHeld != nil {
		whileHeld()
	}
	type resumed struct {
		rep idem.ResumeReport
		err error
	}
	doneB := make(chan resumed, 1)
	go func() {
		rep, err := b.Resume(ctx)
		doneB <- resumed{rep, err}
	}()
	// b either resumes and returns, leaving the operation to a, or takes
	// it over and sends it again, to be held in turn.
	var rb resumed
	got := false
	for deadline := time.Now().Add(time.Minute); !got && !out.taken; {
		select {
		case rb = <-doneB:
			got = true
		case <-time.After(10 * time.Millisecond):
			rec, err := jb.Get(ctx, out.key)
			require.NoError(t, err)
			out.taken = rec.Lease.Owner != a.Owner()
			require.True(t, time.Now().Before(deadline), "the resume neither returned nor took the operation in a minute")
		}
	}
	if beforeRelease != nil {
		beforeRelease()
	}
	g.release()
	if !got {
		rb = <-doneB
	}
	require.NoError(t, rb.err)
	out.resumed = rb.rep
	ra := <-doneA
	out.res, out.err = ra.res, ra.err
	return out
}

// checkKept checks that the driving worker kept its operation and got
// the server's answer, and that the handler ran once.
func checkKept(t *testing.T, j idem.Journal, srv *testserver.Server, o heldOrder, owner string) {
	t.Helper()
	assert.False(t, o.taken, "the operation was taken from %s while it drove it", owner)
	assert.Zero(t, o.resumed.Claimed, "the resuming worker claimed nothing: %+v", o.resumed)
	if assert.NoError(t, o.err, "%s's Do", owner) {
		assert.Equal(t, http.StatusCreated, o.res.StatusCode)
	}
	evs, err := j.History(ctx, o.key)
	require.NoError(t, err)
	for _, ev := range evs {
		assert.NotContains(t, ev.Detail, "taken over", "the history: %+v", evs)
	}
	assert.Equal(t, 1, srv.Executions(), "the handler ran once")
}

// TestLiveWorkerKeepsItsOperationAfterItsSessionEnds: worker-a's liveness
// session is ended by an administrator (pg_terminate_backend) while the
// worker lives on; it then starts an operation, and while the server
// holds the request worker-b resumes. worker-b leaves the operation to
// worker-a, whose Do returns the server's 201.
func TestLiveWorkerKeepsItsOperationAfterItsSessionEnds(t *testing.T) {
	t.Parallel()
	g, srv := newGate(t)
	schema := pgtest.Schema(t)
	var refuse atomic.Bool
	ja := openOn(t, workerPool(t, &refuse), schema)
	jb := openOn(t, pgtest.Pool(t), schema)
	a := workerClient(t, ja, srv, "worker-a")
	b := workerClient(t, jb, srv, "worker-b")

	require.Equal(t, 1, terminateLiveness(t, schema, a.Owner()), "one session holds worker-a's liveness lock")
	o := driveWhileOtherResumes(t, g, a, b, jb, nil, nil)
	checkKept(t, jb, srv, o, "worker-a")
	// The journal's watcher takes the lock again on its own, not before
	// Do returns: at once, unless the machine is busy.
	waitLivenessHeld(t, schema, a.Owner())
}

// TestWorkerWithoutLivenessSessionKeepsItsLeases: worker-a loses its
// liveness session while the server holds its request, and cannot take
// the lock again (it is cut off from the database). It keeps driving the
// operation under its lease; worker-b, resuming meanwhile, does not take
// it while worker-a has been gone for less than worker-b's LivenessGrace.
// Once worker-a is back, its Do returns the server's 201.
func TestWorkerWithoutLivenessSessionKeepsItsLeases(t *testing.T) {
	t.Parallel()
	g, srv := newGate(t)
	schema := pgtest.Schema(t)
	var refuse atomic.Bool
	ja := openOn(t, workerPool(t, &refuse), schema)
	jb := openOn(t, pgtest.Pool(t), schema, postgres.LivenessGrace(time.Minute))
	a := workerClient(t, ja, srv, "worker-a")
	b := workerClient(t, jb, srv, "worker-b")

	o := driveWhileOtherResumes(t, g, a, b, jb, func() {
		refuse.Store(true)
		require.Equal(t, 1, terminateLiveness(t, schema, a.Owner()))
		require.False(t, livenessHeld(t, schema, a.Owner()), "worker-a has no liveness session")
	}, func() {
		require.False(t, livenessHeld(t, schema, a.Owner()), "worker-a has had no liveness session all along")
		refuse.Store(false)
	})
	checkKept(t, jb, srv, o, "worker-a")
	waitLivenessHeld(t, schema, a.Owner())
}

// TestMixedFleetKeepsTheOperationsOfWorkersWithoutLiveness: worker-a's
// journal is opened WithoutLiveness (behind a transaction pooler, say),
// worker-b's with it. worker-b, resuming while worker-a drives an
// operation, leaves it to worker-a until its lease lapses.
func TestMixedFleetKeepsTheOperationsOfWorkersWithoutLiveness(t *testing.T) {
	t.Parallel()
	g, srv := newGate(t)
	schema := pgtest.Schema(t)
	var refuse atomic.Bool
	ja := openOn(t, workerPool(t, &refuse), schema, postgres.WithoutLiveness())
	jb := openOn(t, pgtest.Pool(t), schema)
	a := workerClient(t, ja, srv, "worker-a")
	b := workerClient(t, jb, srv, "worker-b")

	o := driveWhileOtherResumes(t, g, a, b, jb, nil, nil)
	checkKept(t, jb, srv, o, "worker-a")
	var n int
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM `+pgschema.Ident(schema)+`.owners
		WHERE starts_with(name, 'worker-a')`).Scan(&n))
	assert.Zero(t, n, "a journal WithoutLiveness records no owner")
}

// TestClosedJournalLetsGoOfItsOwners: a journal closed with an owner still
// registered (its pool lives on, as the application's does) ends the
// registration: another worker takes the owner's operations at once, its
// lease an hour from lapsing.
func TestClosedJournalLetsGoOfItsOwners(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	var refuse atomic.Bool
	poolA := workerPool(t, &refuse)
	ja, err := postgres.OpenJournal(ctx, poolA, postgres.Schema(schema))
	require.NoError(t, err)
	jb := openOn(t, pgtest.Pool(t), schema)
	keys := createRecords(t, jb, 1)
	_, err = ja.Register(ctx, "worker-a")
	require.NoError(t, err)
	_, err = ja.Acquire(ctx, keys[0], "worker-a", time.Hour)
	require.NoError(t, err)
	require.NoError(t, ja.Close())

	assert.False(t, livenessHeld(t, schema, "worker-a"), "no session holds worker-a's liveness lock")
	got, err := jb.Claim(ctx, idem.ClaimRequest{Owner: "worker-b", Limit: 10, Lease: time.Hour})
	require.NoError(t, err)
	require.Len(t, got, 1, "worker-a's operation is taken at once")
	evs, err := jb.History(ctx, keys[0])
	require.NoError(t, err)
	assert.Equal(t, "taken over from worker-a: its owner is gone", evs[len(evs)-1].Detail)
}

// owners returns the names in the schema's owners table, sorted.
func owners(t *testing.T, schema string) []string {
	t.Helper()
	rows, err := pgtest.Pool(t).Query(ctx, `SELECT name FROM `+pgschema.Ident(schema)+`.owners ORDER BY name`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

// TestOwnersThatAreGoneAndHoldNothingAreRemoved: the owners table keeps
// the owners that live and those whose leases are still to be taken; a
// registration removes the others, whether they ended cleanly or their
// session ended. A live worker whose row was removed while it had no
// session gets it back, with its number, and is seen alive.
func TestOwnersThatAreGoneAndHoldNothingAreRemoved(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	j := openOn(t, pgtest.Pool(t), schema)
	keys := createRecords(t, j, 2)

	for _, name := range []string{"ended-1", "ended-2", "ended-holding"} {
		unregister, err := j.Register(ctx, name)
		require.NoError(t, err)
		if name == "ended-holding" {
			_, err = j.Acquire(ctx, keys[0], name, time.Hour)
			require.NoError(t, err)
		}
		require.NoError(t, unregister())
	}
	live, err := j.Register(ctx, "live")
	require.NoError(t, err)
	defer live()
	// cut-off lives, but has no session and cannot take one.
	var refuse atomic.Bool
	jc := openOn(t, workerPool(t, &refuse), schema)
	_, err = jc.Register(ctx, "cut-off")
	require.NoError(t, err)
	var id int32
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT id FROM `+pgschema.Ident(schema)+`.owners WHERE name = 'cut-off'`).Scan(&id))
	refuse.Store(true)
	require.Equal(t, 1, terminateLiveness(t, schema, "cut-off"))

	next, err := j.Register(ctx, "next")
	require.NoError(t, err)
	defer next()
	assert.Equal(t, []string{"ended-holding", "live", "next"}, owners(t, schema))

	// cut-off comes back: its row is back, with its number.
	refuse.Store(false)
	waitLivenessHeld(t, schema, "cut-off")
	var back int32
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT id FROM `+pgschema.Ident(schema)+`.owners WHERE name = 'cut-off'`).Scan(&back))
	assert.Equal(t, id, back)
	_, err = jc.Acquire(ctx, keys[1], "cut-off", time.Hour)
	require.NoError(t, err)
	got, err := j.Claim(ctx, idem.ClaimRequest{Owner: "taker", Limit: 10, Lease: time.Hour})
	require.NoError(t, err)
	require.Len(t, got, 1, "ended-holding's operation is taken, cut-off's is not")
	assert.Equal(t, keys[0], got[0].Key)
	assert.True(t, strings.HasPrefix(got[0].Lease.Owner, "taker"))
}

// TestLivenessSessionOutlivesIdleSessionTimeout: a server that ends idle
// sessions (idle_session_timeout, set here for the worker's sessions as a
// role or database setting would) does not end the liveness session, idle
// by design: the worker keeps the one session and its operation, while an
// ordinary session of the same settings is ended.
func TestLivenessSessionOutlivesIdleSessionTimeout(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	cfg, err := pgxpool.ParseConfig(pgtest.DSN())
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["idle_session_timeout"] = "200ms"
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return true }
	poolA, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer poolA.Close()
	a := openOn(t, poolA, schema)
	b := openOn(t, pgtest.Pool(t), schema)
	keys := createRecords(t, b, 1)
	unregister, err := a.Register(ctx, "worker-a")
	require.NoError(t, err)
	defer unregister()
	_, err = a.Acquire(ctx, keys[0], "worker-a", time.Hour)
	require.NoError(t, err)
	lockPID := func() []int32 {
		rows, err := pgtest.Pool(t).Query(ctx, livenessLocks(schema, "l.pid"), pgschema.Ident(schema)+".owners", "worker-a")
		require.NoError(t, err)
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		require.NoError(t, err)
		return pids
	}
	before := lockPID()
	require.Len(t, before, 1)

	// An ordinary session, opened after the liveness session, is ended
	// for being idle (a minute bounds a failing run).
	other, err := pgx.ConnectConfig(ctx, cfg.ConnConfig.Copy())
	require.NoError(t, err)
	defer other.Close(ctx)
	pid := other.PgConn().PID()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		var n int
		require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n))
		if n == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "idle_session_timeout did not end an idle session in a minute")
	}
	assert.Equal(t, before, lockPID(), "the liveness session is the one it was")
	got, err := b.Claim(ctx, idem.ClaimRequest{Owner: "worker-b", Limit: 10, Lease: time.Hour})
	require.NoError(t, err)
	assert.Empty(t, got, "worker-a's operation is its own")
}
