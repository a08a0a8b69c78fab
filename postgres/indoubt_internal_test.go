package postgres

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// An ErrorResponse that says the session or its server connection was
// lost (a pooler's "server conn crashed?", class 08; a FATAL) leaves a
// commit in doubt; the server's answer to the statement, and its notices
// that it ended the session before reading it (57P05, 25P03), do not.
func TestDoubtfulTakesALostSessionsErrorForADoubt(t *testing.T) {
	t.Parallel()
	c, err := pgx.Connect(context.Background(), pgtest.DSN())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	for _, tc := range []struct {
		pe    pgconn.PgError
		doubt bool
	}{
		{pgconn.PgError{Severity: "FATAL", Code: "08P01", Message: "server conn crashed?"}, true},
		{pgconn.PgError{Severity: "ERROR", Code: "08006", Message: "connection failure"}, true},
		{pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command"}, true},
		{pgconn.PgError{Severity: "FATAL", Code: "57P05", Message: "terminating connection due to idle-session timeout"}, false},
		{pgconn.PgError{Severity: "FATAL", Code: "25P03", Message: "terminating connection due to idle-in-transaction timeout"}, false},
		{pgconn.PgError{Severity: "ERROR", Code: "40001", Message: "could not serialize access"}, false},
		{pgconn.PgError{Severity: "ERROR", Code: "23505", Message: "duplicate key"}, false},
	} {
		pe := tc.pe
		err := doubtful(c, fmt.Errorf("batch: %w", &pe))
		assert.Equal(t, tc.doubt, asDoubt(err) != nil, "%s", pe.Error())
		assert.ErrorIs(t, err, &pe)
	}
}
