package postgres_test

import (
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgbouncer"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgproxy"
	"github.com/idemkit/idem/postgres/internal/pgschema"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// The tests of this file are an outside review of the fleet's liveness,
// through faults between a worker's journal and PostgreSQL. Each fails on
// the code it was written against (see the commit).

// reviewFleet is worker-a's journal through a proxy (its pool and, as
// they are dialled from the pool's configuration, its liveness sessions),
// with LivenessGrace graceA, and worker-b's journal, direct, with graceB;
// worker-a is registered and leases one operation for an hour.
type reviewFleet struct {
	p          *pgproxy.Proxy
	a, b       *postgres.Journal
	schema     string
	unregister func() error
}

func newReviewFleet(t *testing.T, graceA, graceB time.Duration) *reviewFleet {
	t.Helper()
	p, pool := proxiedPoolOf(t, 2)
	schema := pgtest.Schema(t)
	f := &reviewFleet{p: p, schema: schema}
	f.a = openOn(t, pool, schema, postgres.LivenessGrace(graceA))
	f.b = openOn(t, pgtest.Pool(t), schema, postgres.LivenessGrace(graceB))
	key := createRecords(t, f.b, 1)[0]
	var err error
	f.unregister, err = f.a.Register(ctx, "worker-a")
	require.NoError(t, err)
	_, err = f.a.Acquire(ctx, key, "worker-a", time.Hour)
	require.NoError(t, err)
	return f
}

// ended reports whether worker-a's row says its registration ended.
func (f *reviewFleet) ended(t *testing.T) bool {
	t.Helper()
	var ended bool
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT ended_at IS NOT NULL FROM `+pgschema.Ident(f.schema)+
		`.owners WHERE name = 'worker-a'`).Scan(&ended))
	return ended
}

// takenByB reports whether worker-b's Claim (what its Resume runs) takes
// worker-a's operation now.
func (f *reviewFleet) takenByB(t *testing.T) bool {
	t.Helper()
	got, err := f.b.Claim(ctx, idem.ClaimRequest{Owner: "worker-b", Limit: 1, Lease: time.Hour})
	require.NoError(t, err)
	return len(got) == 1
}

// livenessPID is the server process of the one session holding owner's
// liveness lock. It waits for one (10 s bound a failing run): with the
// tests' short graces, a loaded machine can make the watcher's ping late,
// and the watcher then moves the lock to a new session, when for a moment
// no session holds it.
func livenessPID(t *testing.T, schema, owner string) uint32 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := livenessPIDs(t, schema, owner)
		if len(pids) == 1 {
			return uint32(pids[0])
		}
		require.True(t, time.Now().Before(deadline), "%s's liveness lock held by %d sessions for 10 s", owner, len(pids))
		time.Sleep(10 * time.Millisecond)
	}
}

// TestUnregisterWhoseCommitAcknowledgementIsLostSaysItEnded: unregister
// ends the registration on the liveness session (the row's ended_at, then
// COMMIT, which lets go of the lock). The COMMIT reaches the server and
// commits; its answer is lost and the connection breaks. The registration
// has ended (ended_at is set, the lock is free, worker-b takes worker-a's
// operation at once), yet unregister returns "conn closed": Client.Close
// logs that it could not leave the journal's owners, and Journal.Close
// returns the error. The journal reads back every other write whose
// acknowledgement is lost; unregister should read back ended_at and
// return nil.
func TestUnregisterWhoseCommitAcknowledgementIsLostSaysItEnded(t *testing.T) {
	t.Parallel()
	// worker-a's grace of 8 s: no ping of the watcher meets the fault.
	f := newReviewFleet(t, 8*time.Second, time.Hour)
	fault := f.p.DropReply(pgproxy.IsCommit)
	err := f.unregister()
	fired(t, fault)
	require.True(t, f.ended(t), "the COMMIT committed: the registration ended")
	assert.True(t, f.takenByB(t), "the owner is gone at once")
	assert.NoError(t, err, "unregister reports the end that happened")
}

// TestUnregisterEndsTheRegistrationWhenItsLivenessSessionFails: unregister
// ends the registration on the liveness session alone. When that session
// fails under it, the pool being fine, nothing else is tried:
//
//   - "reply lost": the UPDATE of ended_at reaches the server, its answer
//     is lost and the connection breaks (the transaction, and the UPDATE,
//     roll back). unregister returns "unexpected EOF" at once;
//   - "silent": the session went silent just before (its server side
//     ended, as a NAT that forgot it leaves it, the watcher not having
//     pinged yet). unregister waits ten seconds on it and returns
//     "timeout: context deadline exceeded".
//
// Either way the owner's row does not say it ended, and the owner is not
// gone at once, as the package doc promises of an owner that
// unregisters: worker-b (grace an hour here) cannot take its operation;
// with the default grace it takes it once the grace has run. The registration should
// end through the pool, as it does when the watcher held no session,
// and unregister return nil.
func TestUnregisterEndsTheRegistrationWhenItsLivenessSessionFails(t *testing.T) {
	t.Parallel()
	for name, fault := range map[string]func(t *testing.T, f *reviewFleet){
		"reply lost": func(_ *testing.T, f *reviewFleet) { f.p.DropReply(pgproxy.Executes("SET ended_at")) },
		"silent": func(t *testing.T, f *reviewFleet) {
			require.True(t, f.p.Blackhole(livenessPID(t, f.schema, "worker-a")))
			t.Cleanup(f.p.CutAll)
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// worker-a's grace of 8 s: its watcher pings every 2 s, so the
			// silent session is not yet found out when unregister comes.
			f := newReviewFleet(t, 8*time.Second, time.Hour)
			fault(t, f)
			err := f.unregister()
			assert.NoError(t, err, "unregister ends the registration")
			assert.True(t, f.ended(t), "the owner's row says it ended")
			assert.True(t, f.takenByB(t), "the owner is gone at once")
		})
	}
}

// TestUnregisterReturnsNilOnlyOnceTheRegistrationEnded: unregister takes
// the registration out of the journal before it ends it, so that any
// other call of the same unregister returns nil at once, whether or not
// the registration ended:
//
//   - "while the first is under way": a second call, made while the
//     first is still ending it (the database slow to answer), returns nil
//     while the owner's row does not say it ended and its lock is held;
//   - "after the first failed": the first call fails (its session broke
//     and the database refused connections for a second); a second call,
//     once the database answers again, returns nil, ending nothing: the
//     owner is not gone at once, and there is no way left to end it.
//
// A call of unregister should return nil only once the registration has
// ended: the second should wait for the first, or end it itself.
func TestUnregisterReturnsNilOnlyOnceTheRegistrationEnded(t *testing.T) {
	t.Parallel()
	t.Run("while the first is under way", func(t *testing.T) {
		t.Parallel()
		f := newReviewFleet(t, 8*time.Second, time.Hour)
		f.p.Delay(500 * time.Millisecond)
		first := make(chan error, 1)
		go func() { first <- f.unregister() }()
		time.Sleep(100 * time.Millisecond) // the first is waiting for its UPDATE's answer
		err := f.unregister()
		endedThen := f.ended(t)
		f.p.Delay(0)
		require.NoError(t, <-first)
		require.NoError(t, err)
		assert.True(t, endedThen, "the second unregister returned nil: the registration has ended")
	})
	t.Run("after the first failed", func(t *testing.T) {
		t.Parallel()
		f := newReviewFleet(t, 8*time.Second, time.Hour)
		fault := f.p.DropReplyAndRefuse(pgproxy.Executes("SET ended_at"), time.Second)
		err := f.unregister()
		<-fault.Done()
		require.Error(t, err, "the database was out of reach")
		require.False(t, f.ended(t))
		time.Sleep(1500 * time.Millisecond) // the database answers again
		require.NoError(t, f.unregister())
		assert.True(t, f.ended(t), "the second unregister returned nil: the registration has ended")
		assert.True(t, f.takenByB(t), "the owner is gone")
	})
}

// TestRegisterTakesItsLockDespiteALostReplyOnItsLivenessSession: the
// registration's liveness session breaks once, the answer of one of its
// statements lost (the lock's statement on the liveness connection, or
// the owner's new session written through the pool), while the database
// and the pool answer at once. Register fails ("owner worker-a's liveness
// lock: conn closed", "owner worker-a's liveness session: unexpected
// EOF"), so idem.New fails, where the watcher, meeting the same fault a
// moment later, would take the lock again on a new session; and its
// insert of the owner's row, in doubt, is settled and run again. Register
// should try its liveness session again, as the watcher does, and return
// a registration that holds its lock.
func TestRegisterTakesItsLockDespiteALostReplyOnItsLivenessSession(t *testing.T) {
	t.Parallel()
	for name, statement := range map[string]string{
		"the lock":                "pg_try_advisory_xact_lock",
		"the owner's new session": "OVERRIDING SYSTEM VALUE",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p, pool := proxiedPoolOf(t, 2)
			schema := pgtest.Schema(t)
			a := openOn(t, pool, schema)
			fault := p.DropReply(pgproxy.Executes(statement))
			unregister, err := a.Register(ctx, "worker-a")
			fired(t, fault)
			require.NoError(t, err, "one broken session fails no registration")
			t.Cleanup(func() { _ = unregister() })
			assert.True(t, livenessHeld(t, schema, "worker-a"), "the registered owner holds its lock")
		})
	}
}

// TestLiveWorkerKeepsItsLockThroughAStall: every answer of the database
// to worker-a is held up for 5 s (a network blip that stalls its sessions
// without cutting them; the proxy's Delay holds the answers, what worker-a
// sends still arrives), while worker-a, alive, leases an operation for an
// hour; worker-b, not stalled, claims meanwhile, with the same default
// grace (2 s). The README: "A network blip that stalls a worker's
// sessions without cutting them: its lock stays held, so nobody takes its
// operations however long the stall" (TestStalledWorkerIsNotTakenForDead
// stalls it 400 ms, less than worker-a's ping's 500 ms). Found: the
// watcher pings the liveness session, gets no answer within a quarter of
// the grace, and closes the live session itself, which frees the lock on
// the server at once; its tries on new sessions stall as well; worker-b
// takes worker-a's operation ("its owner is gone") some 3 s into the
// stall. The watcher should not let go of a session the server may still
// hold before a new one holds the lock (a try on a new session finds the
// lock held while the old session lives, and free once it has ended).
func TestLiveWorkerKeepsItsLockThroughAStall(t *testing.T) {
	t.Parallel()
	f := newReviewFleet(t, postgres.DefaultLivenessGrace, postgres.DefaultLivenessGrace)
	f.p.Delay(time.Hour)
	defer f.p.Delay(0)
	start := time.Now()
	for time.Since(start) < 5*time.Second {
		if f.takenByB(t) {
			t.Fatalf("worker-b took the live worker-a's operation %v into the stall; worker-a's lock held: %v",
				time.Since(start).Round(time.Millisecond), livenessHeld(t, f.schema, "worker-a"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestLiveWorkerBehindAPoolerKeepsItsLockWhenThePoolersConnectionsGoSilent:
// worker-a reaches the database through PgBouncer in transaction mode,
// and a NAT or firewall between the pooler and the database forgets every
// connection of the pooler at once (here: a proxy there ends each one's
// server side and drops what the pooler sends, as in
// TestLiveWorkerKeepsItsOperationWhenEveryConnectionGoesSilent, which
// does it between worker and database). The pooler holds, besides the
// liveness session, the server sessions its pool had opened for worker-a's
// statements a moment before, idle now, silent as well. worker-b, direct,
// claims meanwhile; both have the default grace (2 s). The package doc:
// the journal takes the lock again "on a new connection it opens for the
// purpose (never one that idled in the pool, which may have gone silent
// with it)". Behind a pooler, the new connection's statements run on the
// pooler's idle server sessions, silent too: the watcher's tries (each
// given a quarter of the grace, then twice as long) meet them one after
// the other, and worker-b takes the live worker-a's operation ("taken
// 2.07s into it"). With the liveness session alone silent, the same test
// passes (the lock is held again within 0.9 s). A live worker should hold
// its lock again within the grace here too.
func TestLiveWorkerBehindAPoolerKeepsItsLockWhenThePoolersConnectionsGoSilent(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN())
	require.NoError(t, err)
	p, err := pgproxy.Start(net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	upstream := "postgres://" + cfg.ConnConfig.User + "@127.0.0.1:" + strconv.Itoa(p.Addr().Port) + "/" + cfg.ConnConfig.Database + "?sslmode=disable"
	pool := bouncerPool(t, pgbouncer.Start(t, upstream, "default_pool_size = 10"))
	schema := pgtest.Schema(t)
	f := &reviewFleet{p: p, schema: schema}
	f.a = openOn(t, pool, schema)
	f.b = openOn(t, pgtest.Pool(t), schema)
	key := createRecords(t, f.b, 1)[0]
	unregister, err := f.a.Register(ctx, "worker-a")
	require.NoError(t, err)
	t.Cleanup(func() { _ = unregister() })
	_, err = f.a.Acquire(ctx, key, "worker-a", time.Hour)
	require.NoError(t, err)
	// worker-a's pool has just used four server sessions of the pooler's.
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := pool.Exec(ctx, `SELECT pg_sleep(0.2)`)
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	for _, pid := range p.BackendPIDs() {
		p.Blackhole(pid)
	}
	t.Cleanup(p.CutAll)
	start := time.Now()
	for time.Since(start) < 6*time.Second {
		if f.takenByB(t) {
			t.Fatalf("worker-b took the live worker-a's operation %v into it; worker-a's lock held: %v",
				time.Since(start).Round(time.Millisecond), livenessHeld(t, schema, "worker-a"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestDeadWorkerIsTakenAfterTheGraceWhenASweepRacedItsLockTakenAgain:
// Register sweeps the owners that are gone and hold no lease: the rows
// whose lock its statement found free in pg_locks. Its DELETE finds the
// rows afterwards, and one it meets changed (by a commit since the
// statement began) it checks again against that same reading of pg_locks.
// Here worker-a's liveness session has ended and it holds no lease; the
// sweep of worker-b's registration reads pg_locks (worker-a's lock free)
// and waits on another gone owner's row (which another transaction holds
// for a moment: here an administrator's, in a fleet any judgement's or
// registration's); meanwhile worker-a takes its lock again and records its
// new session (session + 1 on its row); then the sweep goes on and
// deletes worker-a's row, its lock held. worker-a, alive, then leases an
// operation for an hour and dies (its sessions cut, none taken again).
// worker-b (grace 200 ms) never takes the operation: a lease whose owner
// has no row is not known gone, and waits for its lapse (an hour here;
// with idem.Client, LeaseDuration), where the package doc promises it is
// taken once its lock stayed free for LivenessGrace. The sweep should not
// delete the row of an owner whose lock is held when it deletes (or the
// owner should find its row gone and write it again).
func TestDeadWorkerIsTakenAfterTheGraceWhenASweepRacedItsLockTakenAgain(t *testing.T) {
	t.Parallel()
	p, pool := proxiedPoolOf(t, 2)
	schema := pgtest.Schema(t)
	owners := pgschema.Ident(schema) + ".owners"
	admin := pgtest.Pool(t)
	a := openOn(t, pool, schema)
	b := openOn(t, admin, schema, postgres.LivenessGrace(200*time.Millisecond))
	rowsOf := func(owner string) (n int) {
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM `+owners+` WHERE name = $1`, owner).Scan(&n))
		return n
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
			require.True(t, time.Now().Before(deadline), "%s: not after 10 s", what)
		}
	}

	// worker-old is gone, its row (before worker-a's in the table) kept by
	// a lease while worker-a registers, then swept-able.
	unregisterOld, err := b.Register(ctx, "worker-old")
	require.NoError(t, err)
	oldKey := createRecords(t, b, 1)[0]
	old, err := b.Acquire(ctx, oldKey, "worker-old", time.Hour)
	require.NoError(t, err)
	require.NoError(t, unregisterOld())
	unregisterA, err := a.Register(ctx, "worker-a")
	require.NoError(t, err)
	t.Cleanup(func() { _ = unregisterA() })
	var session int64
	require.NoError(t, admin.QueryRow(ctx, `SELECT session FROM `+owners+` WHERE name = 'worker-a'`).Scan(&session))
	require.NoError(t, b.Release(ctx, oldKey, old.Lease))

	// worker-a's liveness session ends, and it cannot take its lock again
	// for now.
	p.Refuse(time.Hour)
	require.Equal(t, 1, terminateLiveness(t, schema, "worker-a"))
	// worker-b's sweep finds both locks free and waits on worker-old's row.
	tx, err := admin.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM `+owners+` WHERE name = 'worker-old' FOR UPDATE`)
	require.NoError(t, err)
	registered := make(chan error, 1)
	go func() {
		unregister, err := b.Register(ctx, "worker-b")
		if err == nil {
			t.Cleanup(func() { _ = unregister() })
		}
		registered <- err
	}()
	waitFor("worker-b's sweep waits on worker-old's row", func() bool {
		var n int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND query LIKE 'WITH held AS MATERIALIZED%DELETE FROM `+owners+`%'`).Scan(&n))
		return n > 0
	})
	// worker-a takes its lock again and records its new session.
	p.Refuse(0)
	waitFor("worker-a holds its lock again", func() bool {
		var s int64
		require.NoError(t, admin.QueryRow(ctx, `SELECT session FROM `+owners+` WHERE name = 'worker-a'`).Scan(&s))
		return s > session && livenessHeld(t, schema, "worker-a")
	})
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-registered)
	t.Logf("worker-a's rows once the sweep is done: %d", rowsOf("worker-a"))

	// worker-a, alive, leases an operation; then it dies.
	key := createRecords(t, b, 1)[0]
	_, err = a.Acquire(ctx, key, "worker-a", time.Hour)
	require.NoError(t, err)
	p.Refuse(time.Hour)
	p.CutAll()
	cut := time.Now()
	for time.Since(cut) < 3*time.Second {
		_, err := b.Claim(ctx, idem.ClaimRequest{Owner: "worker-b", Limit: 10, Lease: time.Hour})
		require.NoError(t, err)
		rec, err := b.Get(ctx, key)
		require.NoError(t, err)
		if rec.Lease.Owner == "worker-b" {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the dead worker-a's operation is not taken 3 s after it died (worker-b's grace: 200 ms); worker-a's rows: %d", rowsOf("worker-a"))
}
