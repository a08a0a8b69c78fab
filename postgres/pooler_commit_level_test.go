package postgres_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// TestCommitLevelBehindATransactionPoolerStaysInItsTransaction: behind
// PgBouncer in transaction mode with one server session, the journal's
// writes without a read (one statement each, in the implicit transaction
// of their Sync, which set synchronous_commit with set_config(…, true))
// pass that session from client to client. A deferred write's level must
// end with its transaction: the next client of the pooler's session sees
// the server's own synchronous_commit, and the journal's next intent
// commits at a level that waits for the flush.
func TestCommitLevelBehindATransactionPoolerStaysInItsTransaction(t *testing.T) {
	t.Parallel()
	bouncer := pgtest.StartBouncerWith(t, "default_pool_size = 1")
	direct := pgtest.Pool(t)
	var serverLevel string
	require.NoError(t, direct.QueryRow(ctx, `SELECT reset_val FROM pg_settings WHERE name = 'synchronous_commit'`).Scan(&serverLevel))
	durable := serverLevel
	if durable == "off" {
		durable = "on"
	}
	schema := pgtest.Schema(t)
	j, err := postgres.OpenJournal(ctx, bouncerPool(t, bouncer), postgres.Schema(schema), postgres.WithoutLiveness())
	require.NoError(t, err)
	defer j.Close()
	levels := recordCommitLevels(t, direct, schema, "operations")
	other := bouncerPool(t, bouncer)

	rec := newRecord("shop")
	rec.State, rec.Attempts = idem.StateInFlight, 1
	rec.Lease = idem.Lease{Owner: "w1", ExpiresAt: time.Now().Add(time.Minute)}
	cur, _, err := j.Create(ctx, rec)
	require.NoError(t, err)
	levels.expect(t, "the intent", durable)
	for range 3 {
		next := cur
		next.Attempts++
		cur, err = j.Update(ctx, next, idem.Buffered, idem.Event{Kind: idem.EventSend})
		require.NoError(t, err)
		levels.expect(t, "a buffered update", "off")

		var seen string
		require.NoError(t, other.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&seen))
		assert.Equal(t, serverLevel, seen, "the pooler's next client sees the server's level, not the journal's deferred one")

		_, _, err = j.Create(ctx, newRecord("shop"))
		require.NoError(t, err)
		levels.expect(t, "the intent after a deferred write", durable)
	}
}
