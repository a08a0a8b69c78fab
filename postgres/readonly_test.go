package postgres_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgschema"
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

// A ReadOnly journal reads what a journal reads, directly and behind a
// transaction pooler (where a session's default_transaction_read_only
// cannot be had: PgBouncer refuses it as a startup parameter), and
// refuses every write with ErrReadOnly, changing nothing. It does not
// migrate, and the server itself refuses a write that one of its reads
// would make: here reading the operations table inserts a row, through a
// view that calls a function that does.
func TestReadOnlyJournal(t *testing.T) {
	t.Parallel()
	for name, pool := range map[string]func(t *testing.T) *pgxpool.Pool{
		"direct": func(t *testing.T) *pgxpool.Pool { return pgtest.Pool(t) },
		"pooler": func(t *testing.T) *pgxpool.Pool { return bouncerPool(t, pgtest.StartBouncer(t)) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool := pool(t)
			schema := pgtest.Schema(t)
			_, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema), postgres.ReadOnly())
			require.ErrorIs(t, err, postgres.ErrNotMigrated, "a ReadOnly journal does not migrate")

			w := openOn(t, pgtest.Pool(t), schema)
			rec, _, err := w.Create(ctx, newRecord("s"))
			require.NoError(t, err)
			j := openOn(t, pool, schema, postgres.ReadOnly())
			got, err := j.Get(ctx, rec.Key)
			require.NoError(t, err)
			assert.Equal(t, rec.ID, got.ID)
			_, err = j.Lookup(ctx, "s", rec.ID)
			require.NoError(t, err)
			n := 0
			for _, err := range j.List(ctx, idem.Filter{}) {
				require.NoError(t, err)
				n++
			}
			assert.Equal(t, 1, n)
			counts, err := j.Count(ctx)
			require.NoError(t, err)
			assert.Len(t, counts, 1)
			hist, err := j.History(ctx, rec.Key)
			require.NoError(t, err)
			assert.Len(t, hist, 1)
			_, err = j.History(ctx, "no-such-key")
			assert.ErrorIs(t, err, idem.ErrNotFound)
			_, err = j.Owners(ctx)
			require.NoError(t, err)

			writes := map[string]func() error{
				"Create": func() error { _, _, err := j.Create(ctx, newRecord("s")); return err },
				"Update": func() error {
					r := got
					r.State = idem.StateCanceled
					_, err := j.Update(ctx, r, idem.Durable, idem.Event{Kind: idem.EventOperator})
					return err
				},
				"Acquire": func() error { _, err := j.Acquire(ctx, rec.Key, "w", time.Minute); return err },
				"Release": func() error { return j.Release(ctx, rec.Key, idem.Lease{Owner: "w"}) },
				"Claim": func() error {
					_, err := j.Claim(ctx, idem.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 1})
					return err
				},
				"Renew": func() error {
					_, err := j.Renew(ctx, map[string]idem.Lease{rec.Key: {Owner: "w"}}, time.Minute)
					return err
				},
				"Sync":     func() error { return j.Sync(ctx) },
				"Prune":    func() error { _, err := j.Prune(ctx, time.Now().Add(time.Hour)); return err },
				"Register": func() error { _, err := j.Register(ctx, "w"); return err },
			}
			for name, write := range writes {
				err := write()
				assert.ErrorIs(t, err, postgres.ErrReadOnly, name)
				assert.ErrorContains(t, err, "opened ReadOnly", name)
			}
			after, err := w.History(ctx, rec.Key)
			require.NoError(t, err)
			assert.Equal(t, hist, after, "nothing was written")

			s := pgschema.Ident(schema)
			_, err = pgtest.Pool(t).Exec(ctx, `ALTER TABLE `+s+`.operations RENAME TO operations_rows;
				CREATE TABLE `+s+`.written (n int);
				CREATE FUNCTION `+s+`.note_read() RETURNS boolean LANGUAGE sql VOLATILE AS 'INSERT INTO `+s+`.written VALUES (1); SELECT true';
				CREATE VIEW `+s+`.operations AS SELECT * FROM `+s+`.operations_rows WHERE `+s+`.note_read()`)
			require.NoError(t, err)
			_, err = j.Get(ctx, rec.Key)
			var pe *pgconn.PgError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, "25006", pe.Code, "read_only_sql_transaction: %v", err)
			var written int
			require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM `+s+`.written`).Scan(&written))
			assert.Zero(t, written)
		})
	}
}
