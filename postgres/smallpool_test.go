package postgres_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// Review (issue 22): Register's doc asks for a pool whose MaxConns is
// above the number of clients registered through the journal, and refuses
// (ErrPoolTooSmall) only a registration that would leave no connection
// for anything else. The package doc: a killed worker's operations are
// taken once its lock has stayed free for LivenessGrace; Claim and Acquire
// then take its leases, before they lapse.
//
// What happens: on a pool of 2 with one client registered (allowed),
// Acquire of a SIGKILLed worker's operation never takes it: the write
// transaction holds the one free connection, and the judgement of the
// lease's owner asks the pool for another one, which never comes; it
// gives up after its own 10 s and counts the owner as not gone, so every
// Acquire waits 10 s and returns ErrLeased until the hour's lease lapses.
func TestReview3AcquireOnASmallPoolTakesAKilledWorkersOperation(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN())
	require.NoError(t, err)
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	schema := pgtest.Schema(t)
	j := openOn(t, pool, schema, postgres.LivenessGrace(time.Second))
	keys := createRecords(t, j, 1)
	kill := startHolder(t, schema, "worker-a", time.Hour, true, keys...)
	unregister, err := j.Register(ctx, "worker-b")
	require.NoError(t, err, "one client on a pool of two is allowed")
	defer unregister()

	kill()
	deadline := time.Now().Add(30 * time.Second)
	for {
		started := time.Now()
		rec, err := j.Acquire(ctx, keys[0], "worker-b", time.Hour)
		if err == nil {
			require.Equal(t, "worker-b", rec.Lease.Owner)
			return
		}
		require.True(t, errors.Is(err, idem.ErrLeased), "%v", err)
		t.Logf("Acquire refused after %v: %v", time.Since(started).Round(time.Millisecond), err)
		require.True(t, time.Now().Before(deadline), "the killed worker's operation (lease an hour) is not taken 30 s after SIGKILL, with a grace of 1 s")
		time.Sleep(100 * time.Millisecond)
	}
}
