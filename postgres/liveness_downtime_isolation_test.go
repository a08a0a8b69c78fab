package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgproxy"
	"github.com/idemkit/idem/postgres/internal/pgschema"
	"github.com/idemkit/idem/postgres/internal/pgtest"
	"github.com/idemkit/idem/server"
	"github.com/idemkit/idem/server/storetest"
)

// TestLivenessTransactionHoldsNoSnapshotWhateverTheDefaultIsolation: the
// liveness transaction stays open for the worker's life, so it must hold
// no snapshot (backend_xmin NULL) or VACUUM keeps every dead row of the
// database from the worker's start on. Two things held one: the extended
// protocol's unnamed portal, which keeps its statement's snapshot until
// the next statement (whatever the isolation), and a role or database
// whose default_transaction_isolation is repeatable read or serializable
// (set here for the pool's sessions, as ALTER ROLE ... SET would), which
// keeps the transaction's first snapshot until it ends.
func TestLivenessTransactionHoldsNoSnapshotWhateverTheDefaultIsolation(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"read committed", "repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			schema := pgtest.Schema(t)
			j := openOn(t, poolOfDefaultIsolation(t, level, 3), schema)
			unregister, err := j.Register(ctx, "worker")
			require.NoError(t, err)
			defer unregister()
			waitLivenessHeld(t, schema, "worker")
			var pid int32
			require.NoError(t, pgtest.Pool(t).QueryRow(ctx, livenessLocks(schema, "l.pid"), pgschema.Ident(schema)+".owners", "worker").Scan(&pid))
			// Other sessions' writes go on meanwhile, as a fleet's do.
			createRecords(t, j, 3)
			var xmin *string
			var state string
			require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(),
				`SELECT backend_xmin::text, state FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&xmin, &state))
			assert.Equal(t, "idle in transaction", state)
			assert.Nil(t, xmin, "the liveness transaction holds a snapshot: VACUUM is held back for as long as the worker lives")
		})
	}
}

// poolOfDefaultIsolation returns a pool of maxConns connections to the
// tests' server whose sessions' default_transaction_isolation is level,
// as a role or database setting would make it; closed at the test's end.
func poolOfDefaultIsolation(t *testing.T, level string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN())
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = level
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestClaimsRaceWhateverTheDefaultIsolation: workers that claim at once
// take different operations and never fail for it (FOR UPDATE SKIP LOCKED
// at read committed). A role or database whose default isolation is
// repeatable read or serializable must not turn the race into errors
// ("could not serialize access"): the journal's transactions set their
// own level.
func TestClaimsRaceWhateverTheDefaultIsolation(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			schema := pgtest.Schema(t)
			j := openOn(t, poolOfDefaultIsolation(t, level, 4), schema, postgres.WithoutLiveness())
			const n = 60
			createRecords(t, j, n)
			var mu sync.Mutex
			claimed := map[string]bool{}
			var errs []error
			var wg sync.WaitGroup
			for w := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						recs, err := j.Claim(ctx, idem.ClaimRequest{Owner: fmt.Sprintf("w%d", w), Limit: 2, Lease: time.Hour})
						mu.Lock()
						if err != nil {
							errs = append(errs, err)
						}
						for _, r := range recs {
							assert.False(t, claimed[r.Key], "claimed twice: %s", r.Key)
							claimed[r.Key] = true
						}
						done := len(claimed) == n || len(errs) > 20
						mu.Unlock()
						if done {
							return
						}
					}
				}()
			}
			wg.Wait()
			assert.Empty(t, errs)
			assert.Len(t, claimed, n)
		})
	}
}

// TestStoreWhateverTheDefaultIsolation: the store's conformance suite on
// sessions whose default isolation is repeatable read or serializable, as
// a role or database setting makes it.
func TestStoreWhateverTheDefaultIsolation(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			pool := poolOfDefaultIsolation(t, level, 4) // closed after the suite's parallel tests
			storetest.Run(t, func(t *testing.T) server.Store { return openStoreIn(t, pool, pgtest.Schema(t)) })
		})
	}
}

// TestGraceDoesNotCountTheDatabasesDowntime: worker-a's liveness session
// is cut and worker-b finds its lock free, which starts worker-a's grace;
// at once the database crashes, and stays down longer than the grace.
// When it is back, worker-a, alive all along, has been without its lock
// for a few milliseconds while the database was up: worker-b, judging
// before worker-a has reconnected, must not take worker-a's operation.
// The database's downtime is nobody's absence: no worker could hold a
// lock then. The database stops either at once, as a crash would (its
// recovery empties the journal's unlogged server_up), or cleanly, which
// keeps server_up as it was and moves the postmaster's start.
func TestGraceDoesNotCountTheDatabasesDowntime(t *testing.T) {
	t.Parallel()
	for _, clean := range []bool{false, true} {
		t.Run(map[bool]string{false: "crash", true: "clean stop"}[clean], func(t *testing.T) {
			t.Parallel()
			graceDoesNotCountTheDatabasesDowntime(t, clean)
		})
	}
}

func graceDoesNotCountTheDatabasesDowntime(t *testing.T, clean bool) {
	db := pgtest.StartServer(t)
	proxies, hosts := proxiesTo(t, db)
	const grace = 2 * time.Second
	ja, jb, observer, _ := workerAHoldsInProcess(t, "postgres://postgres@"+hosts+"/postgres?sslmode=disable", db.DSN(), grace)

	// worker-a's session is cut, and it cannot reconnect for now.
	cutOffWorkerA(t, observer, ja.Schema(), jb, proxies)

	// The database stops at once, and is down for longer than the grace.
	if clean {
		db.Stop()
	} else {
		db.Crash()
	}
	time.Sleep(grace + time.Second)
	db.Start()

	// worker-b judges before worker-a has its session back.
	got, err := claimAfterRestart(t, jb)
	require.NoError(t, err)
	assert.Empty(t, got, "worker-a was without its lock for milliseconds while the database was up, and is taken for dead")
	proxies[0].Refuse(0)
	waitUntil(t, "worker-a to hold its lock again", func() bool { return ownerLockHeld(t, observer, ja.Schema(), "worker-a") })
}

// claimAfterRestart claims for worker-b once its pool reaches the
// restarted database (a statement on a connection the restart ended
// fails once).
func claimAfterRestart(t *testing.T, j *postgres.Journal) ([]idem.Record, error) {
	t.Helper()
	var got []idem.Record
	var err error
	for range 5 {
		got, err = j.Claim(ctx, idem.ClaimRequest{Owner: "worker-b", Limit: 10, Lease: time.Hour})
		if err == nil {
			break
		}
	}
	return got, err
}

// proxiesTo starts a pgproxy in front of each server, closed at the
// test's end, and returns them with their addresses joined for a DSN of
// several hosts.
func proxiesTo(t *testing.T, servers ...*pgtest.Server) ([]*pgproxy.Proxy, string) {
	t.Helper()
	var proxies []*pgproxy.Proxy
	var hosts []string
	for _, s := range servers {
		p, err := pgproxy.Start(fmt.Sprintf("127.0.0.1:%d", s.Port()))
		require.NoError(t, err)
		t.Cleanup(func() { _ = p.Close() })
		proxies = append(proxies, p)
		hosts = append(hosts, p.Addr().String())
	}
	return proxies, strings.Join(hosts, ",")
}

// workerAHoldsInProcess opens worker-a's journal on viaProxy and
// worker-b's, with grace, on direct; creates an operation, which worker-a,
// registered, holds for an hour. observer is a pool of its own on direct.
func workerAHoldsInProcess(t *testing.T, viaProxy, direct string, grace time.Duration) (ja, jb *postgres.Journal, observer *pgxpool.Pool, key string) {
	t.Helper()
	ja, err := postgres.OpenJournal(ctx, checkedPool(t, viaProxy))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ja.Close() })
	jb, err = postgres.OpenJournal(ctx, checkedPool(t, direct), postgres.LivenessGrace(grace))
	require.NoError(t, err)
	t.Cleanup(func() { _ = jb.Close() })
	observer = checkedPool(t, direct)
	key = createRecords(t, jb, 1)[0]
	unregister, err := ja.Register(ctx, "worker-a")
	require.NoError(t, err)
	t.Cleanup(func() { _ = unregister() })
	_, err = ja.Acquire(ctx, key, "worker-a", time.Hour)
	require.NoError(t, err)
	return ja, jb, observer, key
}

// workerAHoldsUnprivileged creates role idem_worker, an ordinary login
// role without pg_read_all_stats, through admin, a pool on the primary.
// As that role it opens worker-b's journal, with grace, on direct, and
// starts worker-a, a process of its own on viaProxy (a DSN with the
// role's name in place of %s), holding a new operation for an hour and
// registered. session reads worker-a's liveness session's number.
func workerAHoldsUnprivileged(t *testing.T, admin *pgxpool.Pool, observer *pgxpool.Pool, viaProxy, direct string, grace time.Duration) (jb *postgres.Journal, key string, kill func(), session func() int64) {
	t.Helper()
	const role = "idem_worker"
	_, err := admin.Exec(ctx, `CREATE ROLE `+role+` LOGIN; GRANT CREATE ON DATABASE postgres TO `+role)
	require.NoError(t, err)
	poolB := checkedPool(t, fmt.Sprintf(direct, role))
	jb = openOn(t, poolB, unprivilegedSchema, postgres.LivenessGrace(grace))
	var privileged bool
	require.NoError(t, poolB.QueryRow(ctx, `SELECT pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')`).Scan(&privileged))
	require.False(t, privileged, "the journals' role reads every row of pg_stat_activity")
	key = createRecords(t, jb, 1)[0]
	kill = startHolderOn(t, observer, []string{"IDEM_TEST_POSTGRES=" + fmt.Sprintf(viaProxy, role)}, unprivilegedSchema, "worker-a", time.Hour, true, key)
	session = func() (n int64) {
		require.NoError(t, observer.QueryRow(ctx, `SELECT session FROM `+pgschema.Ident(unprivilegedSchema)+`.owners WHERE name = 'worker-a'`).Scan(&n))
		return n
	}
	return jb, key, kill, session
}

// unprivilegedSchema is the journals' schema in the tests of a role
// without pg_read_all_stats, each on a server of its own.
const unprivilegedSchema = "idem"

// cutOffWorkerA cuts worker-a's connections, which go through proxies,
// and keeps it from reconnecting; once its lock is free, worker-b's claim
// within the grace takes nothing and marks worker-a's lock found free.
func cutOffWorkerA(t *testing.T, observer *pgxpool.Pool, schema string, jb *postgres.Journal, proxies []*pgproxy.Proxy) {
	t.Helper()
	for _, p := range proxies {
		p.Refuse(time.Hour)
		p.CutAll()
	}
	waitUntil(t, "worker-a's lock to be free", func() bool { return !ownerLockHeld(t, observer, schema, "worker-a") })
	got, err := jb.Claim(ctx, idem.ClaimRequest{Owner: "worker-b", Limit: 10, Lease: time.Hour})
	require.NoError(t, err)
	require.Empty(t, got, "within the grace")
	var marked bool
	require.NoError(t, observer.QueryRow(ctx, `SELECT lost_session = session FROM `+pgschema.Ident(schema)+`.owners WHERE name = 'worker-a'`).Scan(&marked))
	require.True(t, marked, "worker-b found worker-a's lock free")
}

// workerALivesThenGoes lets worker-a reconnect through proxies and waits
// until it holds its lock in a session newer than before; worker-b then
// takes nothing. Once worker-a is SIGKILLed (kill), worker-b takes its
// operation, key, and not before the lock has stayed free for the grace,
// whatever its lease had to run.
func workerALivesThenGoes(t *testing.T, observer *pgxpool.Pool, jb *postgres.Journal, proxies []*pgproxy.Proxy,
	session func() int64, before int64, kill func(), key string, grace time.Duration) {
	t.Helper()
	for _, p := range proxies {
		p.Refuse(0)
	}
	// Its lock, and the new session it took it in (written just after).
	waitUntil(t, "worker-a to hold its lock again", func() bool {
		return ownerLockHeld(t, observer, unprivilegedSchema, "worker-a") && session() > before
	})
	got, err := jb.Claim(ctx, idem.ClaimRequest{Owner: "worker-b", Limit: 10, Lease: time.Hour})
	require.NoError(t, err)
	require.Empty(t, got, "worker-a lives")

	killed := time.Now()
	kill()
	got, at := claimUntil(t, jb, "worker-b", 1)
	require.Len(t, got, 1)
	assert.Equal(t, key, got[0].Key)
	assert.GreaterOrEqual(t, at.Sub(killed), grace, "taken before worker-a's lock had been free for the grace")
	evs, err := jb.History(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, "taken over from worker-a: its owner is gone", evs[len(evs)-1].Detail)
	t.Logf("the killed worker's operation was taken %v after SIGKILL (grace %v)", at.Sub(killed).Round(time.Millisecond), grace)
}

// TestGraceDoesNotCountAFailoversDowntime is
// TestGraceDoesNotCountTheDatabasesDowntime across a fail-over: the mark
// that worker-b made on the primary reached the synchronous standby,
// which is promoted longer than the grace after the primary crashed.
func TestGraceDoesNotCountAFailoversDowntime(t *testing.T) {
	t.Parallel()
	primary, standby, dsn := failoverPair(t, true)
	proxies, hosts := proxiesTo(t, primary, standby)
	const grace = 2 * time.Second
	ja, jb, observer, _ := workerAHoldsInProcess(t,
		"postgres://postgres@"+hosts+"/postgres?sslmode=disable&target_session_attrs=read-write", dsn, grace)

	cutOffWorkerA(t, observer, ja.Schema(), jb, proxies)

	primary.Crash()
	time.Sleep(grace + time.Second)
	standby.Promote()

	got, err := claimAfterRestart(t, jb)
	require.NoError(t, err)
	assert.Empty(t, got, "worker-a was without its lock for milliseconds while a primary was up, and is taken for dead")
	for _, p := range proxies {
		p.Refuse(0)
	}
	waitUntil(t, "worker-a to hold its lock again", func() bool { return ownerLockHeld(t, observer, ja.Schema(), "worker-a") })
}

// TestLiveWorkerIsNotTakenForDeadAcrossAFailoverWithoutStatsPrivilege is
// TestGraceDoesNotCountAFailoversDowntime with the journals' role an
// ordinary login role, without pg_read_all_stats: it reads no other
// backend's row of pg_stat_activity, so it cannot see when the promoted
// standby began to take connections as a primary, only when its
// postmaster started, long before. worker-a, a process of its own holding
// an operation, is cut off from both servers and worker-b finds its lock
// free on the primary; the mark reaches the synchronous standby, which is
// promoted longer than the grace after the primary crashed. worker-b,
// judging on the new primary before worker-a has its lock back, must
// leave worker-a's operation; then worker-a takes its lock on the new
// primary. Once worker-a is SIGKILLed, its operation is taken, a grace
// later.
func TestLiveWorkerIsNotTakenForDeadAcrossAFailoverWithoutStatsPrivilege(t *testing.T) {
	t.Parallel()
	primary, standby, dsn := failoverPair(t, true)
	admin := checkedPool(t, primary.DSN())
	proxies, hosts := proxiesTo(t, primary, standby)
	const grace = 2 * time.Second
	observer := checkedPool(t, dsn)
	jb, key, kill, session := workerAHoldsUnprivileged(t, admin, observer,
		"postgres://%s@"+hosts+"/postgres?sslmode=disable&target_session_attrs=read-write",
		fmt.Sprintf("postgres://%%s@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
			primary.Port(), standby.Port()), grace)
	admin.Close()
	before := session()

	cutOffWorkerA(t, observer, unprivilegedSchema, jb, proxies)

	primary.Crash()
	time.Sleep(grace + time.Second) // the fail-over takes longer than the grace
	standby.Promote()

	// worker-b judges on the new primary before worker-a has its lock back.
	got, err := claimAfterRestart(t, jb)
	require.NoError(t, err)
	require.Empty(t, got, "worker-a was without its lock for milliseconds while the new primary was up, and is taken for dead")
	workerALivesThenGoes(t, observer, jb, proxies, session, before, kill, key, grace)
}

// TestLiveWorkerIsNotTakenForDeadAcrossABackendCrashWithoutStatsPrivilege
// is TestGraceDoesNotCountTheDatabasesDowntime for the crash of one
// backend, with the journals' role an ordinary login role, without
// pg_read_all_stats. PostgreSQL then ends every backend and reinitialises
// without a restart (restart_after_crash): pg_postmaster_start_time()
// stays, and such a role reads nothing else of when the server began to
// take connections again. worker-a, a process of its own holding an
// operation, is cut off, and worker-b finds its lock free and marks it;
// then a backend is SIGKILLed, and the server takes no connection for
// longer than the grace (its postmaster held, as a long recovery would).
// worker-b, judging before worker-a has its lock back, must leave its
// operation; once worker-a is SIGKILLed, the operation is taken a grace
// later.
func TestLiveWorkerIsNotTakenForDeadAcrossABackendCrashWithoutStatsPrivilege(t *testing.T) {
	t.Parallel()
	db := pgtest.StartServer(t)
	observer := checkedPool(t, db.DSN())
	proxies, hosts := proxiesTo(t, db)
	const grace = 2 * time.Second
	jb, key, kill, session := workerAHoldsUnprivileged(t, observer, observer,
		"postgres://%s@"+hosts+"/postgres?sslmode=disable",
		fmt.Sprintf("postgres://%%s@127.0.0.1:%d/postgres?sslmode=disable", db.Port()), grace)
	before := session()

	cutOffWorkerA(t, observer, unprivilegedSchema, jb, proxies)

	// One backend crashes, and the server takes no connection for longer
	// than the grace.
	victim, err := pgx.Connect(ctx, db.DSN())
	require.NoError(t, err)
	var pid int32
	var started time.Time
	require.NoError(t, victim.QueryRow(ctx, `SELECT pg_backend_pid(), pg_postmaster_start_time()`).Scan(&pid, &started))
	db.CrashBackend(int(pid), grace+time.Second)
	_ = victim.Close(ctx)

	// worker-b judges before worker-a has its session back.
	got, err := claimAfterRestart(t, jb)
	require.NoError(t, err)
	var restarted time.Time
	require.NoError(t, observer.QueryRow(ctx, `SELECT pg_postmaster_start_time()`).Scan(&restarted))
	require.True(t, restarted.Equal(started), "the postmaster restarted (%v, was %v): not a reinitialisation", restarted, started)
	require.Empty(t, got, "worker-a was without its lock for milliseconds while the server took connections, and is taken for dead")
	workerALivesThenGoes(t, observer, jb, proxies, session, before, kill, key, grace)
}

// TestLiveWorkerWhoseLivenessConnectionGoesSilentKeepsItsOperation: the
// liveness session idles for the worker's life, the connection most
// exposed to a NAT or firewall that forgets idle connections and then
// drops their packets silently. The server's TCP keepalive gives up on
// such a session and ends it, freeing the lock, while the worker's side
// hears nothing: no error, no end, for as long as its own keepalive
// takes (pgx's: 5 minutes idle, then probes). The worker must notice
// within the grace and take its lock again, or it is taken for dead.
func TestLiveWorkerWhoseLivenessConnectionGoesSilentKeepsItsOperation(t *testing.T) {
	t.Parallel()
	proxy, poolA := proxiedPool(t)
	schema := pgtest.Schema(t)
	ja := openOn(t, poolA, schema)
	const grace = 5 * time.Second // worker-a's own is the default, 2 s
	jb := openOn(t, pgtest.Pool(t), schema, postgres.LivenessGrace(grace))
	keys := createRecords(t, jb, 1)
	unregister, err := ja.Register(ctx, "worker-a")
	require.NoError(t, err)
	defer unregister()
	_, err = ja.Acquire(ctx, keys[0], "worker-a", time.Hour)
	require.NoError(t, err)

	pids := livenessPIDs(t, schema, "worker-a")
	require.Len(t, pids, 1)
	require.True(t, proxy.Blackhole(uint32(pids[0])))
	waitUntil(t, "the server to end worker-a's liveness session", func() bool { return !livenessHeld(t, schema, "worker-a") })
	got, err := jb.Claim(ctx, idem.ClaimRequest{Owner: "worker-b", Limit: 10, Lease: time.Hour})
	require.NoError(t, err)
	require.Empty(t, got, "within the grace")
	time.Sleep(grace)
	got, err = jb.Claim(ctx, idem.ClaimRequest{Owner: "worker-b", Limit: 10, Lease: time.Hour})
	require.NoError(t, err)
	assert.Empty(t, got, "worker-a, alive, did not notice its silent liveness connection within the grace, and is taken for dead")
	assert.True(t, livenessHeld(t, schema, "worker-a"), "worker-a holds its lock again")
}
