package postgres_test

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testserver"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgschema"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// smallPool is a pool of at most n connections.
func smallPool(t *testing.T, n int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN())
	require.NoError(t, err)
	cfg.MaxConns = n
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestRegistrationsTakeNoConnectionOfThePool: each registration's
// liveness session is a connection of its own, opened from the pool's
// configuration, so that it never competes with the application (nor the
// journal's writes) for the pool's connections. Registrations were once
// refused (ErrPoolTooSmall) when they would take the pool's last
// connection; now a pool of one serves any number of them, and the
// journal writes with it. Each registration's connection is closed when it
// ends (unregister, Close): the server then has the pool's connections
// only.
func TestRegistrationsTakeNoConnectionOfThePool(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	app := "regconns-" + uuid.NewString()[:8]
	cfg, err := pgxpool.ParseConfig(pgtest.DSN())
	require.NoError(t, err)
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	sessions := func() int {
		var n int
		require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n))
		return n
	}
	// waitSessions waits until the server has want sessions of the
	// journal's (a minute bounds a failing run; it is no measure).
	waitSessions := func(want int) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for sessions() != want {
			require.True(t, time.Now().Before(deadline), "the server has %d sessions of the journal's, not %d", sessions(), want)
			time.Sleep(10 * time.Millisecond)
		}
	}

	j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema))
	require.NoError(t, err)
	unA, err := j.Register(ctx, "a")
	require.NoError(t, err, "a registration on a pool of one connection")
	unB, err := j.Register(ctx, "b")
	require.NoError(t, err)
	srv := testserver.Start(t)
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.StatusURL), Owner: "w"})
	require.NoError(t, err, "a client on a pool of one connection")
	assert.True(t, livenessHeld(t, schema, "a") && livenessHeld(t, schema, "b") && livenessHeld(t, schema, c.Owner()))
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	rec, created, err := j.Create(dctx, newRecord("tenant"))
	require.NoError(t, err, "the journal writes with the pool's only connection")
	require.True(t, created)
	_, err = j.Acquire(dctx, rec.Key, "a", time.Hour)
	require.NoError(t, err)
	waitSessions(int(pool.Stat().TotalConns()) + 3)

	// A registration that ends closes its connection.
	require.NoError(t, unB())
	assert.False(t, livenessHeld(t, schema, "b"))
	waitSessions(int(pool.Stat().TotalConns()) + 2)
	require.NoError(t, c.Close())
	require.NoError(t, unA())
	waitSessions(int(pool.Stat().TotalConns()))

	// So does Close, for the registrations it ends.
	_, err = j.Register(ctx, "d")
	require.NoError(t, err)
	waitSessions(int(pool.Stat().TotalConns()) + 1)
	require.NoError(t, j.Close())
	assert.False(t, livenessHeld(t, schema, "d"))
	waitSessions(int(pool.Stat().TotalConns()))
}

// TestLivenessConnectionIsOpenedAsThePoolOpensItsOwn: the liveness
// session, a connection outside the pool, goes through the pool's hooks,
// which may supply what the session needs (a role, a setting, a
// password); here AfterConnect names the session, and the session that
// holds the lock, first and again after it was ended, carries the name.
// (The pool's BeforeConnect refusing to connect keeps a retake from
// happening: TestWorkerCutOffPastTheGraceIsFencedOff.)
func TestLivenessConnectionIsOpenedAsThePoolOpensItsOwn(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	app := "hooked-" + uuid.NewString()[:8]
	cfg, err := pgxpool.ParseConfig(pgtest.DSN())
	require.NoError(t, err)
	cfg.MaxConns = 2
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `SELECT set_config('application_name', $1, false)`, app)
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	j := openOn(t, pool, schema)
	un, err := j.Register(ctx, "a")
	require.NoError(t, err)
	defer func() { _ = un() }()
	holder := func() string {
		var name string
		require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT application_name FROM pg_stat_activity
			WHERE pid IN (`+livenessLocks(schema, "l.pid")+`)`, pgschema.Ident(schema)+".owners", "a").Scan(&name))
		return name
	}
	assert.Equal(t, app, holder())
	require.Equal(t, 1, terminateLiveness(t, schema, "a"))
	waitLivenessHeld(t, schema, "a")
	assert.Equal(t, app, holder(), "the lock taken again is on a connection opened with the pool's hooks")
}
