package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgproxy"
	"github.com/idemkit/idem/postgres/internal/pgschema"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// The tests of this file are an outside review of the reworked fleet
// liveness (unregister's two ways of ending, Register's retake, make
// before break, overlapping retakes, the sweep by session). Each fails
// on the code it was written against (see the commit).

// TestCloseEndsItsRegistrationsSideBySideOnASilentDatabase: a journal
// holds three registrations (three idem.Clients on one journal) and the
// database stops answering (every answer held). Close ends them one after
// another, each given its liveness session and then the pool for up to
// endTimeout (10 s): 3 × ~10 s, where one registration's end alone takes
// ~10 s. A shutdown on a silent database should cost about one end's
// bound, not one per registration: Close should end them side by side.
// The test lets the database answer again 13 s in and fails if Close had
// not returned by then.
func TestCloseEndsItsRegistrationsSideBySideOnASilentDatabase(t *testing.T) {
	t.Parallel()
	p, pool := proxiedPoolOf(t, 4)
	schema := pgtest.Schema(t)
	j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema), postgres.LivenessGrace(400*time.Millisecond))
	require.NoError(t, err)
	for _, owner := range []string{"worker-1", "worker-2", "worker-3"} {
		_, err := j.Register(ctx, owner)
		require.NoError(t, err)
	}
	p.Delay(time.Hour)
	defer p.Delay(0)
	closed := make(chan error, 1)
	start := time.Now()
	go func() { closed <- j.Close() }()
	select {
	case err := <-closed:
		t.Logf("Close returned after %v: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(13 * time.Second):
		p.Delay(0)
		err := <-closed
		t.Fatalf("Close had not returned 13 s into the silence with three registrations (one end is bounded by 10 s); "+
			"it returned %v in, once the database answered: %v", time.Since(start).Round(time.Millisecond), err)
	}
}

// TestUnregisterOfAnOwnerWhoseRowWasSweptLeavesItGone: worker-a's
// liveness session ends and it cannot connect again for now (new
// connections refused; its pool's connections still answer). worker-b
// registers, and its sweep removes worker-a's row (lock free, no lease).
// worker-a, alive and registered, then leases an operation (Acquire runs
// on its pool) and unregisters: the end through the pool updates no row
// and unregister returns nil. worker-b then cannot take the operation:
// an owner without a row is not known gone, and its lease (an hour here;
// with idem.Client, LeaseDuration) must lapse. The package doc: "An owner
// that unregisters ... is gone at once". unregister should leave a row
// that says the owner ended (or return an error), so that its leases are
// taken at once.
func TestUnregisterOfAnOwnerWhoseRowWasSweptLeavesItGone(t *testing.T) {
	t.Parallel()
	p, pool := proxiedPoolOf(t, 2)
	schema := pgtest.Schema(t)
	a := openOn(t, pool, schema, postgres.LivenessGrace(8*time.Second))
	b := openOn(t, pgtest.Pool(t), schema, postgres.LivenessGrace(time.Hour))
	key := createRecords(t, b, 1)[0]
	unregister, err := a.Register(ctx, "worker-a")
	require.NoError(t, err)
	p.Refuse(time.Hour)
	require.Equal(t, 1, terminateLiveness(t, schema, "worker-a"))
	unregisterB, err := b.Register(ctx, "worker-b")
	require.NoError(t, err)
	t.Cleanup(func() { _ = unregisterB() })
	var rows int
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM `+pgschema.Ident(schema)+`.owners WHERE name = 'worker-a'`).Scan(&rows))
	t.Logf("worker-a's rows after worker-b's sweep: %d", rows)
	_, err = a.Acquire(ctx, key, "worker-a", time.Hour)
	require.NoError(t, err)
	err = unregister()
	t.Logf("unregister: %v", err)
	if err != nil {
		return // an error says the owner may not be gone: honest
	}
	got, err := b.Claim(ctx, idem.ClaimRequest{Owner: "worker-b", Limit: 1, Lease: time.Hour})
	require.NoError(t, err)
	assert.Len(t, got, 1, "worker-a unregistered (nil): its operation is taken at once")
}

// TestASilentLivenessSessionGivenUpLeavesNothingBehindClose: worker-a's
// liveness session goes silent (its server side ended, as a NAT that
// forgot it leaves it: the client's side stays open and hears nothing).
// The watcher's ping goes unanswered, a new session takes the lock, and
// the watcher gives the old one up (the ping stopped, the connection
// closed). worker-a then unregisters and its journal closes, both
// returning nil. Found: the old session's connection is still open, and a
// goroutine with it (pgx's asyncClose of the canceled ping: a cancel
// request, then a Terminate, then a read until the server closes, for up
// to 15 s, which a silent connection never does); goleak finds it after
// Close. A journal that has been closed should leave no connection of
// its own and no goroutine: a connection given up as silent should be
// closed at once (its socket), not drained.
func TestASilentLivenessSessionGivenUpLeavesNothingBehindClose(t *testing.T) {
	p, pool := proxiedPoolOf(t, 2)
	schema := pgtest.Schema(t)
	a, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema), postgres.LivenessGrace(400*time.Millisecond))
	require.NoError(t, err)
	unregister, err := a.Register(ctx, "worker-a")
	require.NoError(t, err)
	before := goleak.IgnoreCurrent()
	old := livenessPID(t, schema, "worker-a")
	require.True(t, p.Blackhole(old))
	deadline := time.Now().Add(10 * time.Second)
	for !livenessHeld(t, schema, "worker-a") || livenessPID(t, schema, "worker-a") == old {
		require.True(t, time.Now().Before(deadline), "worker-a's lock not held again in 10 s")
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, unregister())
	require.NoError(t, a.Close())
	extra := p.Sessions() - int(pool.Stat().TotalConns())
	for end := time.Now().Add(3 * time.Second); extra != 0 && time.Now().Before(end); extra = p.Sessions() - int(pool.Stat().TotalConns()) {
		time.Sleep(50 * time.Millisecond)
	}
	assert.Equal(t, 0, extra, "unregistered and closed, 3 s on: connections of worker-a's beyond its pool's")
	goleak.VerifyNone(t, before)
}

// TestRegisterWhoseLivenessSessionGoesSilentTakesItsLockOnANewOne: the
// liveness connection Register has just opened goes silent (its server
// side ended, as a NAT that forgot it leaves it) while its BEGIN's answer
// is on the way; the pool and new connections answer. idem.New registers
// with context.Background(), and Register runs the lock's statements on
// that context without a bound of their own: it waits for an answer that
// never comes (here for ever; behind a real NAT until the client's TCP
// keepalive gives up, minutes), and idem.New with it (the test gives it
// 6 s, three graces). The watcher gives a
// silent session a quarter of the grace (default 2 s) and retake bounds
// each try; Register should too, and hold its lock on a new session.
func TestRegisterWhoseLivenessSessionGoesSilentTakesItsLockOnANewOne(t *testing.T) {
	t.Parallel()
	p, pool := proxiedPoolOf(t, 2)
	schema := pgtest.Schema(t)
	a := openOn(t, pool, schema)
	p.Delay(200 * time.Millisecond)
	type registered struct {
		unregister func() error
		err        error
	}
	done := make(chan registered, 1)
	go func() {
		u, err := a.Register(context.Background(), "worker-a")
		done <- registered{u, err}
	}()
	// The liveness session's BEGIN has run on the server; its answer is
	// held by the delay: the session goes silent now.
	var pid int32
	for deadline := time.Now().Add(10 * time.Second); pid == 0; time.Sleep(2 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "no liveness session began in 10 s")
		err := pgtest.Pool(t).QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE state = 'idle in transaction'
			AND query LIKE 'BEGIN ISOLATION LEVEL READ COMMITTED%' AND pid = ANY($1)`, pidsOf(p)).Scan(&pid)
		if err != nil {
			pid = 0
		}
	}
	require.True(t, p.Blackhole(uint32(pid)))
	p.Delay(0)
	select {
	case r := <-done:
		require.NoError(t, r.err)
		t.Cleanup(func() { _ = r.unregister() })
		assert.True(t, livenessHeld(t, schema, "worker-a"), "the registered owner holds its lock")
	case <-time.After(6 * time.Second):
		p.CutAll() // lets Register return
		r := <-done
		if r.err == nil {
			_ = r.unregister()
		}
		t.Fatalf("Register had not returned 6 s after its liveness session went silent (default grace, 2 s); once the session was cut: %v", r.err)
	}
}

// pidsOf is the server processes of the proxy's sessions, for ANY($1).
func pidsOf(p *pgproxy.Proxy) []int32 {
	var pids []int32
	for _, pid := range p.BackendPIDs() {
		pids = append(pids, int32(pid))
	}
	return pids
}
