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
	postgres.AfterLock(j, func(pid uint32) {
		if stalls.Add(1) > 1 {
			return
		}
		for {
			var n int
			// On the journal's committer, not the test's goroutine: assert.
			err := db.admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, int32(pid)).Scan(&n)
			if !assert.NoError(t, err) || n == 0 {
				return // ended by the server
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
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
