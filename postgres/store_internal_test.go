package postgres

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// TestStoreWritesCommitAsDocumented: the claim, the take-overs, the lock
// renewal and a default completion wait for the WAL flush; a deferred
// completion, a release and a sweep do not. Each statement sets
// synchronous_commit for its own transaction; this checks which statement
// carries which setting, and what each setting does to a session whose
// default is off, on, or stronger.
func TestStoreWritesCommitAsDocumented(t *testing.T) {
	t.Parallel()
	q := newStoreQueries("idem")
	durable := map[string]string{
		"insert": q.insert, "replace": q.replace, "takeOver": q.takeOver, "renew": q.renew, "complete": q.complete,
	}
	deferred := map[string]string{"completeDeferred": q.completeDeferred, "release": q.release, "sweep": q.sweep}
	for name, sql := range durable {
		assert.Contains(t, sql, commitDurable, "%s must wait for the flush", name)
	}
	for name, sql := range deferred {
		assert.Contains(t, sql, commitDeferred, "%s need not wait for the flush", name)
		assert.NotContains(t, sql, commitDurable, name)
	}

	ctx := context.Background()
	for _, tc := range []struct{ session, durable, deferred string }{
		{"off", "on", "off"},
		{"on", "on", "off"},
		{"local", "local", "off"},
		{"remote_apply", "remote_apply", "off"},
	} {
		t.Run(tc.session, func(t *testing.T) {
			cfg, err := pgxpool.ParseConfig(pgtest.DSN())
			require.NoError(t, err)
			cfg.ConnConfig.RuntimeParams["synchronous_commit"] = tc.session
			cfg.MaxConns = 1
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			defer pool.Close()
			for mode, want := range map[string]string{commitDurable: tc.durable, commitDeferred: tc.deferred} {
				var got string
				require.NoError(t, pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit') FROM (`+mode+`) AS d`).Scan(&got))
				assert.Equal(t, want, got, "within the statement's transaction")
				require.NoError(t, pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&got))
				assert.Equal(t, tc.session, got, "the session's own setting is left as it was")
			}
		})
	}
}

func TestStoreLiteralQuotesAnySchemaName(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	for _, s := range []string{`plain`, `it's`, `back\slash`, `"quoted"`} {
		var got string
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT `+storeLiteral(s)).Scan(&got))
		assert.Equal(t, s, got)
	}
	assert.False(t, strings.HasPrefix(storeLiteral("plain"), "E"))
}
