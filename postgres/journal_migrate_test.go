package postgres_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgschema"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// TestJournalMigratesFromVersion1: a journal that an idem with the first
// schema wrote (events with a foreign key to their operation, no link to
// the creating trace) opens, migrated, with its records and history as
// they were; its Prune deletes the events of what it prunes, as the
// foreign key's cascade did, and new writes work, their link kept.
func TestJournalMigratesFromVersion1(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Pool(t), pgtest.Schema(t)
	require.NoError(t, postgres.MigrateJournalTo(ctx, pool, schema, 1))
	s := pgschema.Ident(schema)
	// A settled operation with two events and an active one with one, as
	// version 1 holds them.
	old := time.Now().Add(-48 * time.Hour).UnixMilli()
	_, err := pool.Exec(ctx, `
		INSERT INTO `+s+`.operations (key, scope, op_id, method, url, body, fingerprint, key_quoted, resends, state,
			attempts, next_attempt_at, lease_epoch, resp_status, resp_body, resp_replayed, created_at, updated_at, version)
		VALUES ('k-done', 'shop', 'done', 'POST', 'http://x/orders', '\x7b7d', 'fp1', false, 0, 4,
			1, 0, 1, 201, '\x7b7d', false, `+itoa(old)+`, `+itoa(old)+`, 2),
		('k-live', 'shop', 'live', 'POST', 'http://x/orders', '\x7b7d', 'fp2', false, 0, 1,
			0, 0, 0, NULL, NULL, NULL, `+itoa(old)+`, `+itoa(old)+`, 1);
		INSERT INTO `+s+`.events (op, version, at, kind, to_state, attempt)
		SELECT id, 1, created_at, 1, 2, 1 FROM `+s+`.operations WHERE key = 'k-done'
		UNION ALL SELECT id, 2, updated_at, 3, 4, 1 FROM `+s+`.operations WHERE key = 'k-done'
		UNION ALL SELECT id, 1, created_at, 1, 1, 0 FROM `+s+`.operations WHERE key = 'k-live'`)
	require.NoError(t, err)
	var fks int
	fkCount := `SELECT count(*) FROM pg_constraint WHERE conrelid = '` + s + `.events'::regclass AND contype = 'f'`
	require.NoError(t, pool.QueryRow(ctx, fkCount).Scan(&fks))
	require.Equal(t, 1, fks, "version 1 has the foreign key")

	_, err = postgres.OpenJournal(ctx, pool, postgres.Schema(schema), postgres.WithoutMigration())
	require.ErrorIs(t, err, postgres.ErrNotMigrated, "version 1 is older than this build")
	j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema))
	require.NoError(t, err)
	defer j.Close()
	require.NoError(t, pool.QueryRow(ctx, fkCount).Scan(&fks))
	assert.Zero(t, fks, "migrated: no foreign key")

	done, err := j.Get(ctx, "k-done")
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, done.State)
	assert.Empty(t, done.Link, "no link before version 3")
	require.NotNil(t, done.Response)
	assert.Equal(t, 201, done.Response.StatusCode)
	h, err := j.History(ctx, "k-done")
	require.NoError(t, err)
	assert.Len(t, h, 2, "the history is kept")

	rec := newRecord("shop")
	rec.Link = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	_, created, err := j.Create(ctx, rec)
	require.NoError(t, err)
	assert.True(t, created, "new writes work")
	got, err := j.Get(ctx, rec.Key)
	require.NoError(t, err)
	assert.Equal(t, rec.Link, got.Link, "version 3 keeps the link")

	n, err := j.Prune(ctx, time.Now().Add(-time.Hour))
	require.NoError(t, err)
	assert.Equal(t, 1, n, "the settled operation is pruned")
	var events int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.events e
		WHERE NOT EXISTS (SELECT 1 FROM `+s+`.operations o WHERE o.id = e.op)`).Scan(&events))
	assert.Zero(t, events, "Prune deleted the pruned operation's events")
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.events`).Scan(&events))
	assert.Equal(t, 1, events, "and kept the others' (the new record's creation event is in its row)")
	h, err = j.History(ctx, rec.Key)
	require.NoError(t, err)
	assert.Len(t, h, 1, "the new record's history")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestJournalMigratesFromVersion4: the due queue, a partial index of
// operations until version 4, becomes the table due: a journal that an
// idem with schema 4 wrote opens with a row of due for each active
// operation and none for a settled one, Claim finds the active one through
// it, and the settle of the claimed operation deletes its row.
func TestJournalMigratesFromVersion4(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Pool(t), pgtest.Schema(t)
	require.NoError(t, postgres.MigrateJournalTo(ctx, pool, schema, 4))
	s := pgschema.Ident(schema)
	old := time.Now().Add(-48 * time.Hour).UnixMilli()
	_, err := pool.Exec(ctx, `
		INSERT INTO `+s+`.operations (key, scope, op_id, method, url, body, fingerprint, key_quoted, resends, state,
			attempts, next_attempt_at, lease_epoch, resp_status, resp_body, resp_replayed, created_at, updated_at, version)
		VALUES ('k-done', 'shop', 'done', 'POST', 'http://x/orders', '\x7b7d', 'fp1', false, 0, 4,
			1, 0, 1, 201, '\x7b7d', false, `+itoa(old)+`, `+itoa(old)+`, 2),
		('k-live', 'shop', 'live', 'POST', 'http://x/orders', '\x7b7d', 'fp2', false, 0, 1,
			0, `+itoa(old)+`, 0, NULL, NULL, NULL, `+itoa(old)+`, `+itoa(old)+`, 1);
		INSERT INTO `+s+`.events (op, version, at, kind, to_state, attempt)
		SELECT id, 1, created_at, 1, 2, 1 FROM `+s+`.operations WHERE key = 'k-done'
		UNION ALL SELECT id, 2, updated_at, 3, 4, 1 FROM `+s+`.operations WHERE key = 'k-done'
		UNION ALL SELECT id, 1, created_at, 1, 1, 0 FROM `+s+`.operations WHERE key = 'k-live'`)
	require.NoError(t, err)

	j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema))
	require.NoError(t, err)
	defer j.Close()
	dueKeys := func() []string {
		rows, err := pool.Query(ctx, `SELECT o.key FROM `+s+`.due d JOIN `+s+`.operations o USING (id) ORDER BY o.key`)
		require.NoError(t, err)
		keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return keys
	}
	assert.Equal(t, []string{"k-live"}, dueKeys(), "the active operation is due, the settled one is not")
	var partial int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexname = 'operations_due'`,
		schema).Scan(&partial))
	assert.Zero(t, partial, "the partial index is gone")

	claimed, err := j.Claim(ctx, idem.ClaimRequest{Owner: "w", Limit: 10, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	assert.Equal(t, "k-live", claimed[0].Key)
	done := claimed[0]
	done.State, done.Response = idem.StateSucceeded, &idem.Response{StatusCode: 201}
	_, err = j.Update(ctx, done, idem.Durable, idem.Event{Kind: idem.EventAnswer})
	require.NoError(t, err)
	assert.Empty(t, dueKeys(), "the settle deleted its operation's row of due")
	h, err := j.History(ctx, "k-done")
	require.NoError(t, err)
	assert.Len(t, h, 2, "the history is kept")
	h, err = j.History(ctx, "k-live")
	require.NoError(t, err)
	require.Len(t, h, 3, "the event written before the migration, the claim's and the settle's")
	for i, ev := range h {
		assert.Equal(t, int64(i+1), ev.Version)
	}
	assert.Equal(t, idem.StateSucceeded, h[2].To)
}
