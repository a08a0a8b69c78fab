package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgschema"
	"github.com/idemkit/idem/postgres/internal/pgtest"
	"github.com/idemkit/idem/server"
	"github.com/idemkit/idem/server/storetest"
)

// TestLivenessTransactionHoldsNoSnapshotWhateverTheDefaultIsolation: the
// liveness transaction stays open for the worker's life, so it must hold
// no snapshot (backend_xmin NULL) or VACUUM keeps every dead row of the
// database from the worker's start on. Two things held one: the extended
// protocol's unnamed portal, which keeps its statement's snapshot until
// the next statement (whatever the isolation), and a role or database
// whose default_transaction_isolation is repeatable read or serializable
// (set here for the pool's sessions, as ALTER ROLE ... SET would), which
// keeps the transaction's first snapshot until it ends.
func TestLivenessTransactionHoldsNoSnapshotWhateverTheDefaultIsolation(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"read committed", "repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			schema := pgtest.Schema(t)
			cfg, err := pgxpool.ParseConfig(pgtest.DSN())
			require.NoError(t, err)
			cfg.MaxConns = 3
			cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = level
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			defer pool.Close()
			j := openOn(t, pool, schema)
			unregister, err := j.Register(ctx, "worker")
			require.NoError(t, err)
			defer unregister()
			waitLivenessHeld(t, schema, "worker")
			var pid int32
			require.NoError(t, pgtest.Pool(t).QueryRow(ctx, livenessLocks(schema, "l.pid"), pgschema.Ident(schema)+".owners", "worker").Scan(&pid))
			// Other sessions' writes go on meanwhile, as a fleet's do.
			createRecords(t, j, 3)
			var xmin *string
			var state string
			require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(),
				`SELECT backend_xmin::text, state FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&xmin, &state))
			assert.Equal(t, "idle in transaction", state)
			assert.Nil(t, xmin, "the liveness transaction holds a snapshot: VACUUM is held back for as long as the worker lives")
		})
	}
}

// TestClaimsRaceWhateverTheDefaultIsolation: workers that claim at once
// take different operations and never fail for it (FOR UPDATE SKIP LOCKED
// at read committed). A role or database whose default isolation is
// repeatable read or serializable must not turn the race into errors
// ("could not serialize access"): the journal's transactions set their
// own level.
func TestClaimsRaceWhateverTheDefaultIsolation(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			schema := pgtest.Schema(t)
			cfg, err := pgxpool.ParseConfig(pgtest.DSN())
			require.NoError(t, err)
			cfg.MaxConns = 4
			cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = level
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			defer pool.Close()
			j := openOn(t, pool, schema, postgres.WithoutLiveness())
			const n = 60
			createRecords(t, j, n)
			var mu sync.Mutex
			claimed := map[string]bool{}
			var errs []error
			var wg sync.WaitGroup
			for w := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						recs, err := j.Claim(ctx, idem.ClaimRequest{Owner: fmt.Sprintf("w%d", w), Limit: 2, Lease: time.Hour})
						mu.Lock()
						if err != nil {
							errs = append(errs, err)
						}
						for _, r := range recs {
							assert.False(t, claimed[r.Key], "claimed twice: %s", r.Key)
							claimed[r.Key] = true
						}
						done := len(claimed) == n || len(errs) > 20
						mu.Unlock()
						if done {
							return
						}
					}
				}()
			}
			wg.Wait()
			assert.Empty(t, errs)
			assert.Len(t, claimed, n)
		})
	}
}

// TestStoreWhateverTheDefaultIsolation: the store's conformance suite on
// sessions whose default isolation is repeatable read or serializable, as
// a role or database setting makes it.
func TestStoreWhateverTheDefaultIsolation(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			cfg, err := pgxpool.ParseConfig(pgtest.DSN())
			require.NoError(t, err)
			cfg.MaxConns = 4
			cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = level
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close) // after the suite's parallel tests
			storetest.Run(t, func(t *testing.T) server.Store { return openStoreIn(t, pool, pgtest.Schema(t)) })
		})
	}
}
