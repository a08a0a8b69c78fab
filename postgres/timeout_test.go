package postgres_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgschema"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// A statement that runs past the session's statement_timeout (here: the
// tables are locked by another session, as a long migration or a VACUUM
// FULL would) fails with an error that names the journal or the store, its
// schema and the operation, and says what to do; the server's error is
// kept.
func TestStatementTimeoutNamesTheSchemaAndSaysWhatToDo(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	require.NoError(t, postgres.MigrateJournal(ctx, pgtest.Pool(t), schema))
	require.NoError(t, postgres.MigrateStore(ctx, pgtest.Pool(t), schema))
	// Long enough for any statement that waits for nothing, on a loaded
	// machine; the locked ones wait for ever.
	pool := settingsPool(t, map[string]string{"statement_timeout": "1000"})
	j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema), postgres.WithoutMigration())
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	s, err := postgres.OpenStore(ctx, pool, postgres.Schema(schema), postgres.WithoutMigration())
	require.NoError(t, err)
	rec, _, err := j.Create(ctx, newRecord("shop"))
	require.NoError(t, err)

	// Another session holds the tables until the test ends.
	tx, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, "LOCK TABLE "+pgschema.Ident(schema)+".operations, "+pgschema.Ident(schema)+".store_entries IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)

	check := func(t *testing.T, err error, names ...string) {
		t.Helper()
		require.Error(t, err)
		var pe *pgconn.PgError
		require.True(t, errors.As(err, &pe), "the server's error is kept: %v", err)
		require.Equal(t, "57014", pe.Code, "the statement timed out: %v", err)
		for _, n := range append(names, schema, "statement_timeout") {
			assert.Contains(t, err.Error(), n)
		}
	}
	t.Run("journal read", func(t *testing.T) {
		_, err := j.Get(ctx, rec.Key)
		check(t, err, "postgres journal", rec.Key)
	})
	t.Run("journal write", func(t *testing.T) {
		next := rec
		next.State = idem.StateInFlight
		_, err := j.Update(ctx, next, idem.Durable, idem.Event{Kind: idem.EventSend})
		check(t, err, "postgres journal", "the update of operation", rec.Key)
	})
	t.Run("store claim", func(t *testing.T) {
		_, err := s.Claim(ctx, claimAt("k1", "fp", time.Now()))
		check(t, err, "postgres store", "claim")
	})
}
