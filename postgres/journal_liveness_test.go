package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
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

// The holder child: a worker that registers, leases the operations it is
// given, says "held", and then does nothing until it is killed.
const (
	holderOwner = "IDEM_HOLDER_OWNER"
	holderKeys  = "IDEM_HOLDER_KEYS" // comma-separated
	holderLease = "IDEM_HOLDER_LEASE"
)

func init() { children["holder"] = holderMain }

func holderMain() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	j, closeJournal, err := openChildJournal(ctx)
	if err != nil {
		return err
	}
	defer closeJournal()
	owner := os.Getenv(holderOwner)
	unregister, err := j.Register(ctx, owner)
	if err != nil {
		return err
	}
	defer unregister()
	lease, err := time.ParseDuration(os.Getenv(holderLease))
	if err != nil {
		return err
	}
	for _, key := range strings.Split(os.Getenv(holderKeys), ",") {
		if _, err := j.Acquire(ctx, key, owner, lease); err != nil {
			return err
		}
	}
	fmt.Println("held")
	<-ctx.Done()
	return nil
}

// startHolder runs a holder of keys and waits until it holds them.
func startHolder(t *testing.T, schema, owner string, lease time.Duration, liveness bool, keys ...string) func() {
	t.Helper()
	return startHolderWith(t, nil, schema, owner, lease, liveness, keys...)
}

// startHolderWith is startHolder with env added to the child's
// environment (IDEM_TEST_POSTGRES: the database it reaches, say).
func startHolderWith(t *testing.T, env []string, schema, owner string, lease time.Duration, liveness bool, keys ...string) func() {
	t.Helper()
	return startHolderOn(t, pgtest.Pool(t), env, schema, owner, lease, liveness, keys...)
}

// startHolderOn is startHolderWith for a child whose database is not the
// tests' shared one: it reads the child's leases through observer.
func startHolderOn(t *testing.T, observer *pgxpool.Pool, env []string, schema, owner string, lease time.Duration, liveness bool, keys ...string) func() {
	t.Helper()
	env = append(append(env, childJournalEnv(schema, liveness)...), holderOwner+"="+owner,
		holderKeys+"="+strings.Join(keys, ","), holderLease+"="+lease.String())
	p := startChild(t, "holder", owner, nil, env...)
	// Held once its leases are in the journal.
	deadline := time.Now().Add(time.Minute)
	for {
		var held int
		require.NoError(t, observer.QueryRow(ctx, `SELECT count(*) FROM `+pgschema.Ident(schema)+
			`.operations WHERE lease_owner = $1`, owner).Scan(&held))
		if held == len(keys) {
			break
		}
		select {
		case <-p.waited:
			t.Fatalf("the holder exited before it held its operations: %v\n%s", p.err, p.stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the holder holds %d of %d operations after a minute", held, len(keys))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return p.kill
}

// createRecords creates n pending operations, due now.
func createRecords(t *testing.T, j idem.Journal, n int) []string {
	t.Helper()
	var keys []string
	for range n {
		rec, created, err := j.Create(ctx, newRecord("tenant"))
		require.NoError(t, err)
		require.True(t, created)
		keys = append(keys, rec.Key)
	}
	return keys
}

// claimUntil claims for owner until it has want operations or a minute
// has passed (a bound for a failing run, not a measure), and returns them
// with when each claim returned.
func claimUntil(t *testing.T, j idem.Journal, owner string, want int) ([]idem.Record, time.Time) {
	t.Helper()
	var got []idem.Record
	deadline := time.Now().Add(time.Minute)
	for len(got) < want {
		recs, err := j.Claim(ctx, idem.ClaimRequest{Owner: owner, Limit: want - len(got), Lease: time.Hour})
		require.NoError(t, err)
		got = append(got, recs...)
		if len(got) < want {
			require.True(t, time.Now().Before(deadline), "%s claimed %d of %d operations in a minute", owner, len(got), want)
			time.Sleep(20 * time.Millisecond)
		}
	}
	return got, time.Now()
}

// TestKilledWorkersOperationsAreTakenAtOnce: a worker process holding
// leases for an hour is SIGKILLed; another worker takes its operations
// once PostgreSQL has ended its session and the journal's LivenessGrace
// has passed, not an hour later, and the history says why. While it lives,
// they are never taken.
func TestKilledWorkersOperationsAreTakenAtOnce(t *testing.T) {
	t.Parallel()
	j := openJournal(t)
	keys := createRecords(t, j, 3)
	kill := startHolder(t, j.Schema(), "worker-killed", time.Hour, true, keys...)

	unregister, err := j.Register(ctx, "worker-taker")
	require.NoError(t, err)
	defer unregister()
	recs, err := j.Claim(ctx, idem.ClaimRequest{Owner: "worker-taker", Limit: 10, Lease: time.Hour})
	require.NoError(t, err)
	assert.Empty(t, recs, "a live worker's operations are never taken")
	_, err = j.Acquire(ctx, keys[0], "worker-taker", time.Hour)
	require.ErrorIs(t, err, idem.ErrLeased)

	killed := time.Now()
	kill()
	got, at := claimUntil(t, j, "worker-taker", len(keys))
	t.Logf("the killed worker's %d operations were taken %v after SIGKILL, their leases had an hour to run", len(got), at.Sub(killed).Round(time.Millisecond))
	for _, rec := range got {
		assert.Contains(t, keys, rec.Key)
		assert.Equal(t, "worker-taker", rec.Lease.Owner)
		assert.Equal(t, int64(2), rec.Lease.Epoch, "the epoch after the killed worker's")
		evs, err := j.History(ctx, rec.Key)
		require.NoError(t, err)
		last := evs[len(evs)-1]
		assert.Equal(t, idem.EventClaim, last.Kind)
		assert.Equal(t, "taken over from worker-killed: its owner is gone", last.Detail)
	}
}

// TestWorkerCutOffPastTheGraceIsFencedOff: a worker whose liveness
// session ends while it is cut off from the database (a network partition)
// cannot take its lock again; once that has lasted another worker's
// LivenessGrace, the other takes its operations, however long their
// leases had to run, and every late write of the first is refused. Back
// in touch, the first worker holds its lock again and is judged alive
// afresh: what it leases next is not taken.
func TestWorkerCutOffPastTheGraceIsFencedOff(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	var refuse atomic.Bool
	a := openOn(t, workerPool(t, &refuse), schema)
	b := openOn(t, pgtest.Pool(t), schema, postgres.LivenessGrace(200*time.Millisecond))

	keys := createRecords(t, a, 3)
	unregisterA, err := a.Register(ctx, "worker-a")
	require.NoError(t, err)
	defer unregisterA()
	held := make([]idem.Record, 2)
	for i, k := range keys[:2] {
		held[i], err = a.Acquire(ctx, k, "worker-a", time.Hour)
		require.NoError(t, err)
	}
	unregisterB, err := b.Register(ctx, "worker-b")
	require.NoError(t, err)
	defer unregisterB()
	recs, err := b.Claim(ctx, idem.ClaimRequest{Owner: "worker-b", Limit: 2, Lease: time.Hour})
	require.NoError(t, err)
	require.Len(t, recs, 1, "worker-a lives: only the free operation is taken")
	require.Equal(t, keys[2], recs[0].Key)

	refuse.Store(true)
	require.Equal(t, 1, terminateLiveness(t, schema, "worker-a"), "one session holds worker-a's liveness lock")
	got, _ := claimUntil(t, b, "worker-b", len(held))
	assert.Len(t, got, len(held), "worker-b takes worker-a's operations once worker-a has stayed gone")
	assert.False(t, livenessHeld(t, schema, "worker-a"), "worker-a had no session all along")

	// worker-a's late writes are refused: an update, a renewal, a release.
	refuse.Store(false)
	next := held[0]
	next.State = idem.StateInFlight
	next.Attempts = 1
	_, err = a.Update(ctx, next, idem.Durable, idem.Event{Kind: idem.EventSend})
	require.ErrorIs(t, err, idem.ErrLeaseLost, "a write under the lost lease")
	n, err := a.Renew(ctx, map[string]idem.Lease{held[1].Key: held[1].Lease}, time.Hour)
	require.NoError(t, err)
	assert.Zero(t, n, "a renewal of the lost lease renews nothing")
	err = a.Release(ctx, held[1].Key, held[1].Lease)
	require.True(t, errors.Is(err, idem.ErrLeaseLost) || errors.Is(err, idem.ErrLeased), "a release of the lost lease: %v", err)
	for _, k := range keys[:2] {
		rec, err := b.Get(ctx, k)
		require.NoError(t, err)
		assert.Equal(t, "worker-b", rec.Lease.Owner, "worker-b still holds %s", k)
		assert.Equal(t, idem.StatePending, rec.State)
	}

	// Back: worker-a's new lease is its own.
	waitLivenessHeld(t, schema, "worker-a")
	fresh := createRecords(t, a, 1)
	_, err = a.Acquire(ctx, fresh[0], "worker-a", time.Hour)
	require.NoError(t, err)
	recs, err = b.Claim(ctx, idem.ClaimRequest{Owner: "worker-b", Limit: 10, Lease: time.Hour})
	require.NoError(t, err)
	assert.Empty(t, recs, "worker-a, once found gone, is alive again")
}

// TestWithoutLivenessLeasesLapse: with liveness off, a killed worker's
// operations are taken only once their leases have lapsed, and the history
// says so.
func TestWithoutLivenessLeasesLapse(t *testing.T) {
	t.Parallel()
	j := openJournal(t, postgres.WithoutLiveness())
	keys := createRecords(t, j, 2)
	const lease = 2 * time.Second
	kill := startHolder(t, j.Schema(), "worker-killed", lease, false, keys...)
	kill()
	recs, err := j.Claim(ctx, idem.ClaimRequest{Owner: "worker-taker", Limit: 10, Lease: time.Hour})
	require.NoError(t, err)
	before, err := j.Get(ctx, keys[0])
	require.NoError(t, err)
	if time.Now().Before(before.Lease.ExpiresAt) {
		assert.Empty(t, recs, "without liveness, a lease that has not lapsed is not taken")
	}
	got, at := claimUntil(t, j, "worker-taker", len(keys))
	t.Logf("taken %v after the leases lapsed", at.Sub(before.Lease.ExpiresAt).Round(time.Millisecond))
	for _, rec := range got {
		evs, err := j.History(ctx, rec.Key)
		require.NoError(t, err)
		last := evs[len(evs)-1]
		assert.Contains(t, last.Detail, "taken over from worker-killed: its lease lapsed at")
		assert.False(t, last.At.Before(before.Lease.ExpiresAt), "taken at %v, before the lease lapsed at %v", last.At, before.Lease.ExpiresAt)
	}
}

// TestLivenessIsPerSchema: journals in two schemas of one database number
// their owners alike (each from 1); a worker registered in one schema
// neither keeps a worker of the other alive nor keeps it from registering.
func TestLivenessIsPerSchema(t *testing.T) {
	t.Parallel()
	a, b := openJournal(t), openJournal(t)
	keepA, err := a.Register(ctx, "worker-a")
	require.NoError(t, err)
	defer keepA()

	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	unregisterB, err := b.Register(rctx, "worker-b")
	require.NoError(t, err, "a worker of another schema, numbered alike, does not hold up Register")
	keys := createRecords(t, b, 1)
	_, err = b.Acquire(ctx, keys[0], "worker-b", time.Hour)
	require.NoError(t, err)
	require.NoError(t, unregisterB())

	// Another process's view of schema b: a journal of its own.
	other, err := postgres.OpenJournal(ctx, pgtest.Pool(t), postgres.Schema(b.Schema()))
	require.NoError(t, err)
	defer other.Close()
	got, err := other.Claim(ctx, idem.ClaimRequest{Owner: "worker-c", Limit: 1, Lease: time.Hour})
	require.NoError(t, err)
	require.Len(t, got, 1, "worker-b is gone, whatever lives in another schema")
}

// TestMarkDoesNotOutliveTheLockHeldAgain: a worker takes its lock again
// before it records its new session, so for a moment its row still names
// the session a mark was made for. worker-a, simulated by sessions that
// take and let go of its lock, is found without it (a mark), takes it
// again longer than the grace later, is judged alive while it holds it,
// and loses it again before it could record the new session. The mark of
// before counted the moments it held the lock as absence: the next
// judgement must mark afresh, and take worker-a's operation only a grace
// later.
func TestMarkDoesNotOutliveTheLockHeldAgain(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Pool(t), pgtest.Schema(t)
	const grace = 300 * time.Millisecond
	jb := openOn(t, pool, schema, postgres.LivenessGrace(grace))
	s := pgschema.Ident(schema)
	var id int32
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+s+`.owners (name, registered_at, session) VALUES ('worker-a', 0, 1) RETURNING id`).Scan(&id))
	keys := createRecords(t, jb, 1)
	_, err := jb.Acquire(ctx, keys[0], "worker-a", time.Hour)
	require.NoError(t, err)
	// hold takes worker-a's liveness lock on a session of its own, and
	// returns what ends that session.
	hold := func() func() {
		c, err := pgx.Connect(ctx, pgtest.DSN())
		require.NoError(t, err)
		_, err = c.Exec(ctx, `SELECT pg_advisory_lock($1::regclass::oid::bigint::int, $2)`, s+".owners", id)
		require.NoError(t, err)
		require.True(t, ownerLockHeld(t, pool, schema, "worker-a"))
		return func() {
			require.NoError(t, c.Close(ctx))
			waitUntil(t, "worker-a's lock to be free", func() bool { return !ownerLockHeld(t, pool, schema, "worker-a") })
		}
	}
	claim := func() []idem.Record {
		got, err := jb.Claim(ctx, idem.ClaimRequest{Owner: "worker-b", Limit: 10, Lease: time.Hour})
		require.NoError(t, err)
		return got
	}
	var marked bool
	mark := `SELECT coalesce(lost_session = session, false) FROM ` + s + `.owners WHERE name = 'worker-a'`

	require.Empty(t, claim(), "worker-a has a live lease, and no mark yet")
	require.NoError(t, pool.QueryRow(ctx, mark).Scan(&marked))
	require.True(t, marked, "worker-b found worker-a's lock free")
	time.Sleep(2 * grace)
	release := hold()
	require.Empty(t, claim(), "worker-a holds its lock")
	release() // before worker-a records its new session
	require.Empty(t, claim(), "the mark made before worker-a held its lock again counted")
	require.NoError(t, pool.QueryRow(ctx, mark).Scan(&marked))
	require.True(t, marked, "worker-b marked worker-a afresh")
	got, _ := claimUntil(t, jb, "worker-b", 1)
	require.Len(t, got, 1)
	assert.Equal(t, keys[0], got[0].Key)
}
