package postgres

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// settle ends a session of its own that sits idle in a transaction (its
// COMMIT never arrived), and leaves an idle one, and every other session,
// alone.
func TestSettleEndsOnlyItsOwnSessionIdleInATransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	connect := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, pgtest.DSN())
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	doubtOf := func(c *pgx.Conn) *commitDoubt {
		d := doubtful(c, assert.AnError)
		require.NotNil(t, asDoubt(d))
		return asDoubt(d)
	}
	alive := func(pid uint32) bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, int32(pid)).Scan(&n))
		return n == 1
	}

	stuck := connect()
	_, err := stuck.Exec(ctx, `BEGIN`)
	require.NoError(t, err)
	other := connect()
	_, err = other.Exec(ctx, `BEGIN`)
	require.NoError(t, err)
	// The same server process, seen from another port: not this session.
	elsewhere := doubtOf(other)
	elsewhere.port++
	d := doubtOf(stuck)

	require.NoError(t, settle(ctx, pool, d))
	assert.False(t, alive(d.pid), "the session idle in its transaction was ended")
	require.NoError(t, settle(ctx, pool, elsewhere))
	assert.True(t, alive(other.PgConn().PID()), "another session is never ended")

	idle := connect()
	require.NoError(t, settle(ctx, pool, doubtOf(idle)))
	assert.NoError(t, idle.Ping(ctx), "an idle session is left alone")
}
