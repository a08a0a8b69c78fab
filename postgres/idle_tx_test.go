package postgres_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
)

// TestAWriteWhoseSessionIdledInItsTransactionRunsAgain: a write that reads
// its row before it writes (here an Update of a row this journal has no
// copy of) holds its transaction open between two round trips; a process
// descheduled there for longer than the role's
// idle_in_transaction_session_timeout finds its session ended by the
// server ("terminating connection due to idle-in-transaction timeout",
// 25P03), its transaction rolled back and nothing of it committed. The
// write runs again on another session instead of failing its caller (it
// failed a Do of TestShortTimeoutsOfTheRoleFailNothing once under load).
// The stall lasts until the server has ended the session, watched from
// another session, not for a set time.
func TestAWriteWhoseSessionIdledInItsTransactionRunsAgain(t *testing.T) {
	t.Parallel()
	db := poolWithDefaults(t, "role", 4, map[string]string{"idle_in_transaction_session_timeout": "50ms"})
	creator := openOn(t, db.pool, "idem", postgres.WithoutLiveness())
	rec := newRecord("shop")
	rec.State, rec.Attempts = idem.StateInFlight, 1
	created, _, err := creator.Create(ctx, rec)
	require.NoError(t, err)

	j := openOn(t, db.pool, "idem", postgres.WithoutLiveness()) // no copy of the row: it reads first
	var stalls atomic.Int32
	postgres.IdleInTx(j, stallOnce(t, db, &stalls))
	next := created
	next.State = idem.StateSucceeded
	next.Response = &idem.Response{StatusCode: 201}
	got, err := j.Update(ctx, next, idem.Durable, idem.Event{Kind: idem.EventAnswer})
	require.NoError(t, err, "a write whose session the server ended for idling in its transaction runs again")
	assert.Equal(t, idem.StateSucceeded, got.State)
	assert.GreaterOrEqual(t, stalls.Load(), int32(2), "it ran again")
	stored, err := creator.Get(ctx, created.Key)
	require.NoError(t, err)
	assert.Equal(t, got.Version, stored.Version)
	assert.Equal(t, created.Version+1, stored.Version, "written once")
}

// TestAClaimWhoseSessionIdledInItsTransactionRunsAgain: a claim (as a
// renewal of leases, and a prune) runs in a transaction of several round
// trips; its session ended by the server for idling in it before its
// commit (25P03), nothing of it committed, it runs again on another
// session instead of failing.
func TestAClaimWhoseSessionIdledInItsTransactionRunsAgain(t *testing.T) {
	t.Parallel()
	db := poolWithDefaults(t, "role", 4, map[string]string{"idle_in_transaction_session_timeout": "50ms"})
	j := openOn(t, db.pool, "idem", postgres.WithoutLiveness())
	keys := createRecords(t, j, 2)
	var stalls atomic.Int32
	postgres.IdleInTx(j, stallOnce(t, db, &stalls))
	got, err := j.Claim(ctx, idem.ClaimRequest{Owner: "worker", Limit: 10, Lease: time.Hour})
	require.NoError(t, err, "a claim whose session the server ended for idling in its transaction runs again")
	assert.Len(t, got, len(keys))
	assert.GreaterOrEqual(t, stalls.Load(), int32(2), "it ran again")
}

// stallOnce returns a hook for postgres.IdleInTx that, the first time,
// holds its transaction open until the server has ended the session (as
// its idle_in_transaction_session_timeout does), watched from another
// session rather than waited for a set time; it counts its calls.
func stallOnce(t *testing.T, db *defaultsDB, calls *atomic.Int32) func(pid uint32) {
	return func(pid uint32) {
		if calls.Add(1) > 1 {
			return
		}
		for {
			var n int
			// On the journal's goroutine, not the test's: assert.
			err := db.admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, int32(pid)).Scan(&n)
			if !assert.NoError(t, err) || n == 0 {
				return // ended by the server
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
