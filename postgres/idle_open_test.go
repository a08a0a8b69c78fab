package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/postgres"
)

// TestOpenOnASessionEndedForIdling: opening a journal or a store migrates
// its tables first (MigrateJournal, MigrateStore) and, on a pool that
// reads results as text, reads bytea_output. With idle_session_timeout
// set for the role below pgxpool's one-second check, a connection that
// idled between the two is handed out ended, and the migration's BEGIN
// met "terminating connection due to idle-session timeout" (57P05): the
// open failed (seen on CI as TestNoCallFailsOnASessionEndedForIdling's
// OpenJournal, a fresh connection descheduled past the timeout before its
// first statement). Nothing of such a statement ran: it runs again on
// another session, as the journal's and the store's other calls do.
func TestOpenOnASessionEndedForIdling(t *testing.T) {
	t.Parallel()
	const idle = 600 * time.Millisecond // past the timeout, within pgxpool's second
	opens := map[string]func(context.Context, *pgxpool.Pool) error{
		"journal": func(ctx context.Context, p *pgxpool.Pool) error {
			j, err := postgres.OpenJournal(ctx, p, postgres.Schema("idem"))
			if err == nil {
				_ = j.Close()
			}
			return err
		},
		"store": func(ctx context.Context, p *pgxpool.Pool) error {
			s, err := postgres.OpenStore(ctx, p, postgres.Schema("idem"))
			if err == nil {
				_ = s.Close()
			}
			return err
		},
		"MigrateJournal": func(ctx context.Context, p *pgxpool.Pool) error { return postgres.MigrateJournal(ctx, p, "idem") },
		"MigrateStore":   func(ctx context.Context, p *pgxpool.Pool) error { return postgres.MigrateStore(ctx, p, "idem") },
	}
	for name, open := range opens {
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec} {
			t.Run(name+"/"+mode.String(), func(t *testing.T) {
				t.Parallel()
				db := poolWithDefaults(t, "role", 2, map[string]string{"idle_session_timeout": "200ms"})
				cfg := db.pool.Config()
				cfg.ConnConfig.DefaultQueryExecMode = mode
				pool, err := pgxpool.NewWithConfig(ctx, cfg)
				require.NoError(t, err)
				t.Cleanup(pool.Close)
				// Two connections made, both idle in the pool past the
				// server's timeout: the next two statements meet 57P05.
				c1, err := pool.Acquire(ctx)
				require.NoError(t, err)
				c2, err := pool.Acquire(ctx)
				require.NoError(t, err)
				c1.Release()
				c2.Release()
				time.Sleep(idle)
				require.NoError(t, open(ctx, pool), "%s after the pool's sessions idled past idle_session_timeout", name)
			})
		}
	}
}
