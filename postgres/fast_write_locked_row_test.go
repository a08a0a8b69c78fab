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
)

// holdRowUntilAWriteWaits begins a transaction on admin that changes the row of key (its
// note, to the same value: the record stays as it was, its xmin does
// not), and waits until a session of database name waits for that row's
// lock, write running meanwhile. It returns the transaction, to commit or
// roll back, and a channel closed once write has returned.
func holdRowUntilAWriteWaits(t *testing.T, admin *pgxpool.Pool, schema, name, key string, write func()) (pgx.Tx, <-chan struct{}) {
	t.Helper()
	tx, err := admin.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctx, `UPDATE `+pgx.Identifier{schema, "operations"}.Sanitize()+` SET note = note WHERE key = $1`, key)
	require.NoError(t, err)
	var holder int32
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&holder))
	done := make(chan struct{})
	go func() { defer close(done); write() }()
	for {
		var waiting bool
		require.NoError(t, admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = $1 AND $2 = ANY (pg_blocking_pids(pid)))`, name, holder).Scan(&waiting))
		if waiting {
			return tx, done
		}
		select {
		case <-done:
			t.Fatal("the write ended without waiting for the row")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// TestWriteWithoutAReadOverARowChangedWhileItWaitsWhateverTheDefaultIsolation:
// a write without a read (one statement in the implicit transaction of its
// Sync, at the session's default isolation) of a row this journal wrote
// last waits for the row's lock, which another session holds while it
// changes the row, then commits. At read committed the statement's fence
// (the row's xmin) writes nothing; at repeatable read or serializable, set
// on the role, it fails with a serialization failure. Either way the
// write must run again through the read and succeed, once, at the next
// version: not fail, and not be in doubt.
func TestWriteWithoutAReadOverARowChangedWhileItWaitsWhateverTheDefaultIsolation(t *testing.T) {
	t.Parallel()
	for _, iso := range []string{"read committed", "repeatable read", "serializable"} {
		t.Run(iso, func(t *testing.T) {
			t.Parallel()
			db := poolWithDefaults(t, "role", 4, map[string]string{"default_transaction_isolation": iso})
			var session string
			require.NoError(t, db.pool.QueryRow(ctx, `SHOW default_transaction_isolation`).Scan(&session))
			require.Equal(t, iso, session, "the role's default reaches the journal's sessions")
			schema := "idem"
			j, created, next := inFlightAndItsAnswer(t, db.pool, schema)
			var got idem.Record
			var uerr error
			tx, done := holdRowUntilAWriteWaits(t, db.admin, schema, db.name, created.Key, func() {
				got, uerr = j.Update(ctx, next, idem.Durable, idem.Event{Kind: idem.EventAnswer})
			})
			require.NoError(t, tx.Commit(ctx))
			<-done
			require.NoError(t, uerr, "the row is the journal's: the write runs again through the read")
			assert.Equal(t, created.Version+1, got.Version)
			stored, err := j.Get(ctx, created.Key)
			require.NoError(t, err)
			assert.Equal(t, idem.StateSucceeded, stored.State)
			assert.Equal(t, created.Version+1, stored.Version)
			hist, err := j.History(ctx, created.Key)
			require.NoError(t, err)
			assert.Len(t, hist, 2, "the creation and the answer, once each")
		})
	}
}

// TestWriteWithoutAReadThatOutwaitsLockTimeoutChangesNothing: with a small
// lock_timeout on the role, a write without a read that waits for a row
// another session holds fails (the server ended its statement, and with
// it the implicit transaction): the error is the server's, not a commit
// in doubt, the row is as it was, and the same update, made again once the
// other session has let go, is written.
func TestWriteWithoutAReadThatOutwaitsLockTimeoutChangesNothing(t *testing.T) {
	t.Parallel()
	db := poolWithDefaults(t, "role", 4, map[string]string{"lock_timeout": "200ms"})
	schema := "idem"
	j, created, next := inFlightAndItsAnswer(t, db.pool, schema)
	tx, err := db.admin.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT FROM `+pgx.Identifier{schema, "operations"}.Sanitize()+` WHERE key = $1 FOR UPDATE`, created.Key)
	require.NoError(t, err)
	_, uerr := j.Update(ctx, next, idem.Durable, idem.Event{Kind: idem.EventAnswer})
	require.NoError(t, tx.Rollback(ctx))
	require.Error(t, uerr)
	assert.NotErrorIs(t, uerr, postgres.ErrCommitInDoubt, "the server refused the statement: nothing is in doubt")
	stored, err := j.Get(ctx, created.Key)
	require.NoError(t, err)
	assert.Equal(t, created.Version, stored.Version, "nothing was written")

	got, err := j.Update(ctx, next, idem.Durable, idem.Event{Kind: idem.EventAnswer})
	require.NoError(t, err)
	assert.Equal(t, created.Version+1, got.Version)
	hist, err := j.History(ctx, created.Key)
	require.NoError(t, err)
	assert.Len(t, hist, 2, "the creation and the answer, once each")
}

// inFlightAndItsAnswer opens a journal without liveness in schema on pool
// (closed when t ends), creates an operation in flight under a lease, and
// returns it with the update that settles it with a 201.
func inFlightAndItsAnswer(t *testing.T, pool *pgxpool.Pool, schema string) (*postgres.Journal, idem.Record, idem.Record) {
	t.Helper()
	j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema), postgres.WithoutLiveness())
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	rec := newRecord("shop")
	rec.State, rec.Attempts = idem.StateInFlight, 1
	rec.Lease = idem.Lease{Owner: "w1", ExpiresAt: time.Now().Add(time.Minute)}
	created, _, err := j.Create(ctx, rec)
	require.NoError(t, err)
	next := created
	next.State = idem.StateSucceeded
	next.Response = &idem.Response{StatusCode: 201}
	return j, created, next
}
