package pgschema_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres/internal/pgschema"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

var kind = pgschema.Kind{Name: "journal", Marker: "things", Migrations: []string{
	`CREATE TABLE things (id int PRIMARY KEY)`,
	`ALTER TABLE things ADD COLUMN name text`,
}}

func TestMigrateCreatesOnceEvenFromManyAtOnce(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Pool(t), pgtest.Schema(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { errs[i] = pgschema.Migrate(ctx, pool, schema, kind) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	v, err := pgschema.Version(ctx, pool, schema, kind)
	require.NoError(t, err)
	assert.Equal(t, 2, v)
	_, err = pool.Exec(ctx, `INSERT INTO `+pgschema.Ident(schema)+`.things (id, name) VALUES (1, 'x')`)
	require.NoError(t, err, "both migrations ran")
	require.NoError(t, pgschema.Migrate(ctx, pool, schema, kind), "migrating again changes nothing")
}

func TestMigrateRefusesForeignAndNewer(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()

	foreign := pgtest.Schema(t)
	_, err := pool.Exec(ctx, `CREATE SCHEMA `+pgschema.Ident(foreign)+`; CREATE TABLE `+pgschema.Ident(foreign)+`.things (x text)`)
	require.NoError(t, err)
	err = pgschema.Migrate(ctx, pool, foreign, kind)
	require.ErrorIs(t, err, idem.ErrNotJournal)
	assert.Contains(t, err.Error(), foreign)
	var cols int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'things'`, foreign).Scan(&cols))
	assert.Equal(t, 1, cols, "the foreign table is left as it was")

	newer := pgtest.Schema(t)
	require.NoError(t, pgschema.Migrate(ctx, pool, newer, kind))
	_, err = pool.Exec(ctx, `UPDATE `+pgschema.Ident(newer)+`.idem_schema SET version = 9`)
	require.NoError(t, err)
	err = pgschema.Migrate(ctx, pool, newer, kind)
	require.ErrorIs(t, err, idem.ErrSchemaTooNew)
	assert.Contains(t, err.Error(), "upgrade idem")

	require.Error(t, pgschema.Migrate(ctx, pool, "", kind), "a schema needs a name")
}
