package postgres_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
	pool, schema, s := journalOfVersion(t, 1)
	insertDoneAndLive(t, pool, s, 0)
	var fks int
	fkCount := `SELECT count(*) FROM pg_constraint WHERE conrelid = '` + s + `.events'::regclass AND contype = 'f'`
	require.NoError(t, pool.QueryRow(ctx, fkCount).Scan(&fks))
	require.Equal(t, 1, fks, "version 1 has the foreign key")

	_, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema), postgres.WithoutMigration())
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

// TestJournalMigratesFromVersion4: an owner that a journal of version 4
// or 5 found without its lock an hour ago (a mark for its session, on the
// server's timeline at version 5, its lease with an hour to run) is not
// taken for gone at once by the migrated journal: the mark may have been
// made before a crash or a promotion that the journal cannot tell of, so
// it counts from the migrated journal's first judgement at the earliest
// (when it first found the server up, in the unlogged server_up). The
// operation is taken once the grace has passed from then.
func TestJournalMigratesFromVersion4(t *testing.T) {
	t.Parallel()
	for _, version := range []int{4, 5} {
		t.Run(fmt.Sprint(version), func(t *testing.T) {
			pool, schema, s := journalOfVersion(t, version)
			old := time.Now().Add(-time.Hour).UnixMilli()
			owner := `INSERT INTO ` + s + `.owners (name, registered_at, session, lost_session, lost_at) VALUES ('worker-old', ` + itoa(old) + `, 1, 1, ` + itoa(old) + `)`
			if version == 5 {
				owner = `INSERT INTO ` + s + `.owners (name, registered_at, session, lost_session, lost_at, lost_timeline)
					VALUES ('worker-old', ` + itoa(old) + `, 1, 1, ` + itoa(old) + `, ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint)`
			}
			_, err := pool.Exec(ctx, owner+`;
				INSERT INTO `+s+`.operations (key, scope, op_id, method, url, body, fingerprint, key_quoted, resends, state,
					attempts, next_attempt_at, lease_owner, lease_epoch, lease_expires_at, created_at, updated_at, version)
				VALUES ('k-held', 'shop', 'held', 'POST', 'http://x/orders', '\x7b7d', 'fp', false, 0, 1,
					0, 0, 'worker-old', 1, `+itoa(time.Now().Add(time.Hour).UnixMilli())+`, `+itoa(old)+`, `+itoa(old)+`, 1);
				INSERT INTO `+s+`.events (op, version, at, kind, to_state, attempt)
				SELECT id, 1, created_at, 1, 1, 0 FROM `+s+`.operations WHERE key = 'k-held'`)
			require.NoError(t, err)

			const grace = 200 * time.Millisecond
			j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema), postgres.LivenessGrace(grace))
			require.NoError(t, err)
			defer j.Close()
			var persistence string
			require.NoError(t, pool.QueryRow(ctx, `SELECT relpersistence::text FROM pg_class WHERE oid = $1::regclass`, s+".server_up").Scan(&persistence))
			assert.Equal(t, "u", persistence, "server_up is not unlogged: a crash recovery would not empty it")
			got, err := j.Claim(ctx, idem.ClaimRequest{Owner: "worker-new", Limit: 10, Lease: time.Hour})
			require.NoError(t, err)
			assert.Empty(t, got, "a mark of version %d counted from when it was made: the owner was taken for gone at the first judgement", version)

			got, _ = claimUntil(t, j, "worker-new", 1)
			require.Len(t, got, 1)
			assert.Equal(t, "k-held", got[0].Key)
			h, err := j.History(ctx, "k-held")
			require.NoError(t, err)
			assert.Equal(t, "taken over from worker-old: its owner is gone", h[len(h)-1].Detail)
		})
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// journalOfVersion returns a pool, a schema of its own holding the journal's
// tables as version of the schema made them, and the schema quoted.
func journalOfVersion(t *testing.T, version int) (*pgxpool.Pool, string, string) {
	t.Helper()
	pool, schema := pgtest.Pool(t), pgtest.Schema(t)
	require.NoError(t, postgres.MigrateJournalTo(ctx, pool, schema, version))
	return pool, schema, pgschema.Ident(schema)
}

// insertDoneAndLive writes, as the first versions of the schema held them,
// two operations made two days ago: k-done settled with two events, and
// k-live active with one, due at liveDueAt (Unix milliseconds).
func insertDoneAndLive(t *testing.T, pool *pgxpool.Pool, s string, liveDueAt int64) {
	t.Helper()
	old := time.Now().Add(-48 * time.Hour).UnixMilli()
	_, err := pool.Exec(ctx, `
		INSERT INTO `+s+`.operations (key, scope, op_id, method, url, body, fingerprint, key_quoted, resends, state,
			attempts, next_attempt_at, lease_epoch, resp_status, resp_body, resp_replayed, created_at, updated_at, version)
		VALUES ('k-done', 'shop', 'done', 'POST', 'http://x/orders', '\x7b7d', 'fp1', false, 0, 4,
			1, 0, 1, 201, '\x7b7d', false, `+itoa(old)+`, `+itoa(old)+`, 2),
		('k-live', 'shop', 'live', 'POST', 'http://x/orders', '\x7b7d', 'fp2', false, 0, 1,
			0, `+itoa(liveDueAt)+`, 0, NULL, NULL, NULL, `+itoa(old)+`, `+itoa(old)+`, 1);
		INSERT INTO `+s+`.events (op, version, at, kind, to_state, attempt)
		SELECT id, 1, created_at, 1, 2, 1 FROM `+s+`.operations WHERE key = 'k-done'
		UNION ALL SELECT id, 2, updated_at, 3, 4, 1 FROM `+s+`.operations WHERE key = 'k-done'
		UNION ALL SELECT id, 1, created_at, 1, 1, 0 FROM `+s+`.operations WHERE key = 'k-live'`)
	require.NoError(t, err)
}

// TestJournalMigratesTheDueQueueFromVersion4: the due queue, a partial index of
// operations until version 4, becomes the table due: a journal that an
// idem with schema 4 wrote opens with a row of due for each active
// operation and none for a settled one, Claim finds the active one through
// it, and the settle of the claimed operation deletes its row.
func TestJournalMigratesTheDueQueueFromVersion4(t *testing.T) {
	t.Parallel()
	pool, schema, s := journalOfVersion(t, 4)
	insertDoneAndLive(t, pool, s, time.Now().Add(-48*time.Hour).UnixMilli())

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
