package postgres_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// A pool whose sessions cannot write (a hot standby, or
// default_transaction_read_only on for the role or database): opening
// the journal or the store fails with an error that names what was being
// opened and says what to do, and still carries the server's error.
func TestOpenOnAReadOnlyDatabaseSaysSo(t *testing.T) {
	t.Parallel()
	pool := settingsPool(t, map[string]string{"default_transaction_read_only": "on"})
	for name, open := range map[string]func(schema string) error{
		"store": func(schema string) error {
			_, err := postgres.OpenStore(ctx, pool, postgres.Schema(schema))
			return err
		},
		"journal": func(schema string) error {
			_, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema))
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			schema := pgtest.Schema(t)
			err := open(schema)
			require.Error(t, err)
			assert.Contains(t, err.Error(), schema, "names the schema being migrated")
			assert.Contains(t, err.Error(), "primary", "says to point the pool at a database that takes writes")
			var pe *pgconn.PgError
			assert.True(t, errors.As(err, &pe), "the server's error is kept")
			assert.ErrorIs(t, err, postgres.ErrReadOnly)
		})
	}
}

// settingsPool is a pool whose sessions start with params, as a role's or
// a database's settings would give them.
func settingsPool(t *testing.T, params map[string]string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN())
	require.NoError(t, err)
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// A store opened WithoutMigration on a pool whose sessions cannot write
// would answer every claim with a 503: the open refuses it, naming the
// schema and saying what to do. The journal is not refused: idem ls and
// idem ui read a journal through a read-only pool (a replica).
func TestStoreWithoutMigrationOnAReadOnlyDatabaseIsRefused(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	require.NoError(t, postgres.MigrateStore(ctx, pgtest.Pool(t), schema))
	pool := settingsPool(t, map[string]string{"default_transaction_read_only": "on"})
	_, err := postgres.OpenStore(ctx, pool, postgres.Schema(schema), postgres.WithoutMigration())
	require.Error(t, err, "a store that can write nothing is refused at open")
	require.ErrorIs(t, err, postgres.ErrReadOnly)
	assert.Contains(t, err.Error(), schema, "names the schema")
	assert.Contains(t, err.Error(), "primary", "says to point the pool at a database that takes writes")

	require.NoError(t, postgres.MigrateJournal(ctx, pgtest.Pool(t), schema))
	j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema), postgres.WithoutMigration())
	require.NoError(t, err, "a journal may be read through a read-only pool")
	_ = j.Close()
}
