package postgres_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgschema"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

func TestOpenJournalRefusesAnotherProgramsTables(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Pool(t), pgtest.Schema(t)
	_, err := pool.Exec(ctx, `CREATE SCHEMA `+pgschema.Ident(schema)+`;
		CREATE TABLE `+pgschema.Ident(schema)+`.operations (id int PRIMARY KEY, note text)`)
	require.NoError(t, err)
	for name, opts := range map[string][]postgres.Option{
		"migrating":         nil,
		"without migration": {postgres.WithoutMigration()},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := postgres.OpenJournal(ctx, pool, append(opts, postgres.Schema(schema))...)
			require.ErrorIs(t, err, idem.ErrNotJournal)
			assert.Contains(t, err.Error(), schema, "the error names the schema")
		})
	}
	require.ErrorIs(t, postgres.MigrateJournal(ctx, pool, schema), idem.ErrNotJournal)
	var cols int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns
		WHERE table_schema = $1 AND table_name = 'operations'`, schema).Scan(&cols))
	assert.Equal(t, 2, cols, "the other program's table is left as it was")
}

func TestOpenJournalRefusesANewerJournal(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Pool(t), pgtest.Schema(t)
	require.NoError(t, postgres.MigrateJournal(ctx, pool, schema))
	_, err := pool.Exec(ctx, `UPDATE `+pgschema.Ident(schema)+`.idem_schema SET version = 99 WHERE kind = 'journal'`)
	require.NoError(t, err)
	for name, opts := range map[string][]postgres.Option{
		"migrating":         nil,
		"without migration": {postgres.WithoutMigration()},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := postgres.OpenJournal(ctx, pool, append(opts, postgres.Schema(schema))...)
			require.ErrorIs(t, err, idem.ErrSchemaTooNew)
			assert.Contains(t, err.Error(), "99")
			assert.Contains(t, err.Error(), "upgrade idem", "the error says what to do")
		})
	}
}

func TestOpenJournalWithoutMigrationNeedsMigratedTables(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Pool(t), pgtest.Schema(t)
	_, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema), postgres.WithoutMigration())
	require.ErrorIs(t, err, postgres.ErrNotMigrated)
	assert.Contains(t, err.Error(), "do not exist")
	assert.Contains(t, err.Error(), "postgres.MigrateJournal", "the error says what to do")
	var tables int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_schema = $1`, schema).Scan(&tables))
	assert.Zero(t, tables, "nothing was created")

	require.NoError(t, postgres.MigrateJournal(ctx, pool, schema))
	j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema), postgres.WithoutMigration())
	require.NoError(t, err, "a journal opened on tables migrated apart works")
	defer j.Close()
	_, created, err := j.Create(ctx, newRecord("tenant"))
	require.NoError(t, err)
	assert.True(t, created)
}

func TestOpenRefusesOptionsOfTheOther(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Pool(t), pgtest.Schema(t)
	_, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema), postgres.DeferCompletes())
	require.ErrorContains(t, err, "DeferCompletes configures OpenStore, not OpenJournal")
	_, err = postgres.OpenStore(ctx, pool, postgres.Schema(schema), postgres.MaxBatch(4), postgres.WithoutLiveness())
	require.ErrorContains(t, err, "MaxBatch and WithoutLiveness configure OpenJournal, not OpenStore")
	var tables int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_schema = $1`, schema).Scan(&tables))
	assert.Zero(t, tables, "nothing was created")
}

func TestOpenJournalRefusesBadArguments(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Pool(t), pgtest.Schema(t)
	for name, tc := range map[string]struct {
		opts []postgres.Option
		want string
	}{
		"no schema":  {[]postgres.Option{postgres.Schema("")}, "name a schema"},
		"batch":      {[]postgres.Option{postgres.Schema(schema), postgres.MaxBatch(0)}, "MaxBatch 0: at least 1"},
		"body limit": {[]postgres.Option{postgres.Schema(schema), postgres.MaxBodySize(-1)}, "MaxBodySize -1: at least 1"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := postgres.OpenJournal(ctx, pool, tc.opts...)
			require.ErrorContains(t, err, tc.want)
		})
	}
	_, err := postgres.OpenJournal(ctx, nil)
	require.ErrorContains(t, err, "pgxpool.New")
	require.ErrorContains(t, postgres.MigrateJournal(ctx, nil, "idem"), "pgxpool.New")
}
