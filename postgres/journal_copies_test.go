package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgschema"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// TestWritesWithoutReadingSeeOthersChanges: a journal writes the rows it
// wrote last without reading them first, checking that no one has changed
// them since. Here another journal on the same tables (another process of
// a fleet) changes the row in between, in each way a row can change: an
// update, a renewal, a release and a new lease; the first journal's next
// write must be judged against the row as it is, not as it wrote it.
func TestWritesWithoutReadingSeeOthersChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	open := func() *postgres.Journal {
		j, err := postgres.OpenJournal(ctx, pgtest.Pool(t), postgres.Schema(schema))
		require.NoError(t, err)
		t.Cleanup(func() { _ = j.Close() })
		return j
	}
	j1, j2 := open(), open()
	lease := idem.Lease{Owner: "w1", ExpiresAt: time.Now().Add(time.Minute)}
	create := func(t *testing.T) idem.Record {
		rec := newRecord("copies")
		rec.State, rec.Lease = idem.StateInFlight, lease
		out, created, err := j1.Create(ctx, rec)
		require.NoError(t, err)
		require.True(t, created)
		return out
	}

	t.Run("updated by another", func(t *testing.T) {
		rec := create(t)
		other := rec
		other.Attempts = 1
		v2, err := j2.Update(ctx, other, idem.Durable, idem.Event{Kind: idem.EventSend})
		require.NoError(t, err)
		// j1's copy is at version 1, the row at 2.
		stale := rec
		stale.Attempts = 2
		_, err = j1.Update(ctx, stale, idem.Durable, idem.Event{Kind: idem.EventSend})
		require.ErrorIs(t, err, idem.ErrConflict)
		got, err := j1.Get(ctx, rec.Key)
		require.NoError(t, err)
		assert.Equal(t, int64(2), got.Version)
		assert.Equal(t, 1, got.Attempts)
		// A write at the row's version succeeds, though j1's copy said 1.
		v2.Attempts = 3
		v3, err := j1.Update(ctx, v2, idem.Durable, idem.Event{Kind: idem.EventSend})
		require.NoError(t, err)
		assert.Equal(t, int64(3), v3.Version)
		assert.Equal(t, 3, v3.Attempts)
		h, err := j1.History(ctx, rec.Key)
		require.NoError(t, err)
		assert.Len(t, h, 3)
	})

	t.Run("renewed by another", func(t *testing.T) {
		rec := create(t)
		n, err := j2.Renew(ctx, map[string]idem.Lease{rec.Key: rec.Lease}, time.Hour)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		renewed, err := j2.Get(ctx, rec.Key)
		require.NoError(t, err)
		require.True(t, renewed.Lease.ExpiresAt.After(rec.Lease.ExpiresAt))
		next := rec
		next.Attempts = 1
		out, err := j1.Update(ctx, next, idem.Durable, idem.Event{Kind: idem.EventSend})
		require.NoError(t, err)
		// The renewal stands: j1's copy had the earlier expiry.
		assert.Equal(t, renewed.Lease.ExpiresAt, out.Lease.ExpiresAt)
		got, err := j1.Get(ctx, rec.Key)
		require.NoError(t, err)
		assert.Equal(t, renewed.Lease.ExpiresAt, got.Lease.ExpiresAt)
		assert.Equal(t, 1, got.Attempts)
	})

	t.Run("released and leased again by another", func(t *testing.T) {
		rec := create(t)
		require.NoError(t, j2.Release(ctx, rec.Key, rec.Lease))
		taken, err := j2.Acquire(ctx, rec.Key, "w2", time.Minute)
		require.NoError(t, err)
		require.Equal(t, int64(2), taken.Lease.Epoch)
		// j1's copy still shows its own lease at epoch 1, and the version
		// matches none: the row says the lease is lost.
		next := rec
		next.Attempts = 1
		_, err = j1.Update(ctx, next, idem.Durable, idem.Event{Kind: idem.EventSend})
		require.True(t, errors.Is(err, idem.ErrLeaseLost), "%v", err)
		got, err := j1.Get(ctx, rec.Key)
		require.NoError(t, err)
		assert.Equal(t, "w2", got.Lease.Owner)
		assert.Equal(t, 0, got.Attempts)
	})

	// The other writer commits while j1's write waits for the row's lock:
	// j1's statement read the row before that commit, and must check the
	// fence again on the row as the other left it, not overwrite it.
	t.Run("updated by another while the write waits", func(t *testing.T) {
		rec := create(t)
		pool := pgtest.Pool(t)
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck // committed below
		_, err = tx.Exec(ctx, `UPDATE `+pgschema.Ident(schema)+`.operations SET attempts = 1, version = version + 1 WHERE key = $1`, rec.Key)
		require.NoError(t, err)
		stale := rec
		stale.Attempts = 2
		errc := make(chan error, 1)
		go func() {
			_, err := j1.Update(ctx, stale, idem.Durable, idem.Event{Kind: idem.EventSend})
			errc <- err
		}()
		// Until j1's update waits for the row's lock.
		require.Eventually(t, func() bool {
			var waiting bool
			err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND query LIKE '%UPDATE%' || $1 || '%')`, schema).Scan(&waiting)
			return err == nil && waiting
		}, 10*time.Second, 5*time.Millisecond)
		require.NoError(t, tx.Commit(ctx))
		require.ErrorIs(t, <-errc, idem.ErrConflict, "judged against the row as the other left it")
		got, err := j1.Get(ctx, rec.Key)
		require.NoError(t, err)
		assert.Equal(t, int64(2), got.Version)
		assert.Equal(t, 1, got.Attempts, "the other's write stands")
	})

	t.Run("pruned", func(t *testing.T) {
		rec := create(t)
		done := rec
		done.State = idem.StateSucceeded
		settled, err := j2.Update(ctx, done, idem.Durable, idem.Event{Kind: idem.EventAnswer})
		require.NoError(t, err)
		_, err = j2.Prune(ctx, time.Now().Add(time.Hour))
		require.NoError(t, err)
		_ = settled
		next := rec
		next.Attempts = 1
		_, err = j1.Update(ctx, next, idem.Durable, idem.Event{Kind: idem.EventSend})
		require.ErrorIs(t, err, idem.ErrNotFound)
	})
}
