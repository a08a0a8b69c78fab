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

// TestJournalMigratesFromVersion7: the creation event of a row created
// without a read, held in its ev_ columns at version 1, stays in the row
// from version 8 on when the row moves past (the cr_ columns), in place
// of a row of events. A journal that an idem with schema 7 wrote (a row at
// version 1 holding its creation event, a settled row whose creation
// event is in events and whose settle's event it holds) opens with both
// histories as they were; the one at version 1 settles through the read,
// its creation event written into events as before; and a new operation
// created and settled by the migrated journal (each write without a read)
// writes no event row, its history the same two events.
func TestJournalMigratesFromVersion7(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Pool(t), pgtest.Schema(t)
	require.NoError(t, postgres.MigrateJournalTo(ctx, pool, schema, 7))
	s := pgschema.Ident(schema)
	old := time.Now().Add(-time.Hour).UnixMilli()
	lease := time.Now().Add(time.Hour).UnixMilli()
	_, err := pool.Exec(ctx, `
		INSERT INTO `+s+`.operations (key, scope, op_id, method, url, body, fingerprint, key_quoted, resends, state,
			attempts, next_attempt_at, lease_owner, lease_epoch, lease_expires_at, resp_status, resp_body, resp_replayed,
			created_at, updated_at, version, ev_at, ev_kind, ev_from, ev_owner)
		VALUES ('k-done', 'shop', 'done', 'POST', 'http://x/orders', '\x7b7d', 'fp1', false, 0, 4,
			1, 0, NULL, 1, NULL, 201, '\x7b7d', false, `+itoa(old)+`, `+itoa(old+5)+`, 2, `+itoa(old+5)+`, 3, 2, 'w-old'),
		('k-live', 'shop', 'live', 'POST', 'http://x/orders', '\x7b7d', 'fp2', false, 0, 2,
			1, `+itoa(lease)+`, 'w-old', 1, `+itoa(lease)+`, NULL, NULL, NULL, `+itoa(old)+`, `+itoa(old)+`, 1, `+itoa(old)+`, 1, NULL, 'w-old');
		INSERT INTO `+s+`.events (op, version, at, kind, to_state, attempt, owner)
		SELECT id, 1, created_at, 1, 2, 1, 'w-old' FROM `+s+`.operations WHERE key = 'k-done';
		INSERT INTO `+s+`.due SELECT next_attempt_at, id FROM `+s+`.operations WHERE key = 'k-live'`)
	require.NoError(t, err)

	_, err = postgres.OpenJournal(ctx, pool, postgres.Schema(schema), postgres.WithoutMigration())
	require.ErrorIs(t, err, postgres.ErrNotMigrated, "version 7 is older than this build")
	j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema))
	require.NoError(t, err)
	defer j.Close()
	eventRows := func(key string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.events e JOIN `+s+`.operations o ON o.id = e.op
			WHERE o.key = $1`, key).Scan(&n))
		return n
	}
	history := func(key string) []idem.Event {
		h, err := j.History(ctx, key)
		require.NoError(t, err)
		return h
	}
	h := history("k-done")
	require.Len(t, h, 2, "the settled operation's history is kept")
	assert.Equal(t, idem.EventCreate, h[0].Kind)
	assert.Equal(t, idem.StateSucceeded, h[1].To)
	assert.Equal(t, idem.StateInFlight, h[1].From)
	h = history("k-live")
	require.Len(t, h, 1, "the creation event held in the row")
	assert.Equal(t, "w-old", h[0].Owner)

	live, err := j.Get(ctx, "k-live")
	require.NoError(t, err)
	live.State, live.Response = idem.StateSucceeded, &idem.Response{StatusCode: 201}
	_, err = j.Update(ctx, live, idem.Buffered, idem.Event{Kind: idem.EventAnswer})
	require.NoError(t, err)
	h = history("k-live")
	require.Len(t, h, 2)
	assert.Equal(t, idem.EventCreate, h[0].Kind)
	assert.Equal(t, "w-old", h[0].Owner)
	assert.Equal(t, 2, eventRows("k-live"), "settled through the read: its creation event and its settle's written into events")

	rec := newRecord("shop")
	rec.State, rec.Attempts = idem.StateInFlight, 1
	rec.Lease = idem.Lease{Owner: "w-new", ExpiresAt: time.Now().Add(time.Minute)}
	created, _, err := j.Create(ctx, rec)
	require.NoError(t, err)
	next := created
	next.State, next.Response = idem.StateSucceeded, &idem.Response{StatusCode: 201}
	settled, err := j.Update(ctx, next, idem.Buffered, idem.Event{Kind: idem.EventAnswer})
	require.NoError(t, err)
	assert.Zero(t, eventRows(rec.Key), "a create and a settle without a read write no event row")
	h = history(rec.Key)
	require.Len(t, h, 2)
	want := idem.Event{Version: 1, At: created.CreatedAt, Kind: idem.EventCreate, To: idem.StateInFlight, Attempt: 1, Owner: "w-new"}
	assert.Equal(t, want.Version, h[0].Version)
	assert.Equal(t, want.At.UnixMilli(), h[0].At.UnixMilli())
	assert.Equal(t, []any{want.Kind, want.From, want.To, want.Attempt, want.Owner, want.StatusCode, want.Error, want.Detail},
		[]any{h[0].Kind, h[0].From, h[0].To, h[0].Attempt, h[0].Owner, h[0].StatusCode, h[0].Error, h[0].Detail},
		"the creation event kept in the row")
	assert.Equal(t, settled.Version, h[1].Version)
	assert.Equal(t, idem.EventAnswer, h[1].Kind)
	assert.Equal(t, 201, h[1].StatusCode)
}
