package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgtest"
	"github.com/idemkit/idem/server"
)

// TestWritesAreDurableWhateverTheDefault: with synchronous_commit off as
// the database's or the role's default (a common tuning), every write the
// promise needs on disk (the journal's intents, claims and Sync, the
// store's claims and completions) still commits with synchronous_commit on,
// and the writes documented as deferred still commit with it off. Each
// commit is read by a deferred trigger, which runs at COMMIT and so sees
// the level the commit waits at.
func TestWritesAreDurableWhateverTheDefault(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"database", "role"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			pool := poolWithSyncCommitOff(t, level)
			ctx := context.Background()
			var session string
			require.NoError(t, pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&session))
			require.Equal(t, "off", session, "the %s's default reaches the journal's sessions", level)

			schema := "idem"
			j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema))
			require.NoError(t, err)
			defer j.Close()
			s, err := postgres.OpenStore(ctx, pool, postgres.Schema(schema))
			require.NoError(t, err)
			defer s.Close()
			levels := recordCommitLevels(t, pool, schema, "operations", "sync", "store_entries")

			now := time.Now()
			rec := newRecord("shop")
			rec.State, rec.Attempts = idem.StateInFlight, 1
			rec.Lease = idem.Lease{Owner: "w1", ExpiresAt: now.Add(time.Minute)}
			created, _, err := j.Create(ctx, rec)
			require.NoError(t, err)
			levels.expect(t, "create (the intent)", "on")

			_, err = j.Renew(ctx, map[string]idem.Lease{created.Key: created.Lease}, time.Minute)
			require.NoError(t, err)
			levels.expect(t, "renew", "off")

			next := created
			next.State = idem.StateUnknown
			unknown, err := j.Update(ctx, next, idem.Buffered, idem.Event{Kind: idem.EventAnswer})
			require.NoError(t, err)
			levels.expect(t, "a buffered update (an outcome)", "off")

			require.NoError(t, j.Release(ctx, unknown.Key, unknown.Lease))
			levels.expect(t, "release", "off")

			acquired, err := j.Acquire(ctx, unknown.Key, "w2", time.Minute)
			require.NoError(t, err)
			levels.expect(t, "acquire (a claim)", "on")

			next = acquired
			next.State = idem.StatePending
			pending, err := j.Update(ctx, next, idem.Durable, idem.Event{Kind: idem.EventAnswer})
			require.NoError(t, err)
			levels.expect(t, "a durable update", "on")

			require.NoError(t, j.Release(ctx, pending.Key, pending.Lease))
			levels.take(t)
			claimed, err := j.Claim(ctx, idem.ClaimRequest{Owner: "w3", Lease: time.Minute, Limit: 10})
			require.NoError(t, err)
			require.Len(t, claimed, 1)
			levels.expect(t, "claim", "on")

			require.NoError(t, j.Sync(ctx))
			levels.expect(t, "sync", "on")

			claim := server.ClaimRequest{Scope: "tenant", Key: "k1", Fingerprint: "fp", Method: http.MethodPost, Path: "/orders",
				Now: now, ExpiresAt: now.Add(time.Hour), StaleBefore: now.Add(-time.Minute)}
			res, err := s.Claim(ctx, claim)
			require.NoError(t, err)
			require.True(t, res.Claimed)
			levels.expect(t, "the store's claim", "on")

			require.NoError(t, s.Complete(ctx, server.CompleteRequest{Scope: "tenant", Key: "k1", Token: res.Token,
				ExpiresAt: now.Add(time.Hour), Response: &server.StoredResponse{Status: 201, Header: http.Header{}, Body: []byte("ok")}}))
			levels.expect(t, "the store's completion", "on")
		})
	}
}

// poolWithSyncCommitOff returns a pool on a database of the test's own
// whose sessions start with synchronous_commit off: set on the database
// ("database"), or on a role of the test's own that the pool logs in as
// ("role"). Both are dropped when the test ends.
func poolWithSyncCommitOff(t *testing.T, level string) *pgxpool.Pool {
	t.Helper()
	return poolWithDefaults(t, level, 4, map[string]string{"synchronous_commit": "off"}).pool
}

// defaultsDB is a database of a test's own on the shared server, whose
// sessions start with settings given as the database's or a role's
// defaults (ALTER DATABASE / ALTER ROLE ... SET), as an operator sets
// them.
type defaultsDB struct {
	// pool logs in as the role (or, with database-level settings, as the
	// tests' user): its sessions start with the settings.
	pool *pgxpool.Pool
	// admin logs in as the tests' user, its sessions' settings the
	// server's own: for a test's own statements (a migration under
	// default_transaction_read_only, say).
	admin *pgxpool.Pool
	name  string
}

// poolWithDefaults creates a database of the test's own, and, for
// level "role", a role of its own that owns it, then sets settings on the
// database ("database") or on the role ("role"). Both are dropped when the
// test ends; the settings of the shared database are never touched.
func poolWithDefaults(t *testing.T, level string, maxConns int32, settings map[string]string) *defaultsDB {
	t.Helper()
	ctx := context.Background()
	admin := pgtest.Pool(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "idem_sc_" + hex.EncodeToString(b[:])
	id := pgx.Identifier{name}.Sanitize()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN())
	require.NoError(t, err)
	cfg.ConnConfig.Database = name
	cfg.MaxConns = maxConns
	adminCfg := cfg.Copy()
	adminCfg.MaxConns = 2
	var target string
	switch level {
	case "database":
		_, err = admin.Exec(ctx, `CREATE DATABASE `+id)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `DROP DATABASE IF EXISTS `+id+` WITH (FORCE)`) })
		target = `DATABASE ` + id
	case "role":
		_, err = admin.Exec(ctx, `CREATE ROLE `+id+` LOGIN`)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `DROP ROLE IF EXISTS `+id) })
		_, err = admin.Exec(ctx, `CREATE DATABASE `+id+` OWNER `+id)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `DROP DATABASE IF EXISTS `+id+` WITH (FORCE)`) })
		target = `ROLE ` + id
		cfg.ConnConfig.User = name
	default:
		t.Fatalf("no level %q", level)
	}
	for k, v := range settings {
		_, err = admin.Exec(ctx, `ALTER `+target+` SET `+pgx.Identifier{k}.Sanitize()+` = `+storeLiteralForTest(v))
		require.NoError(t, err)
		// The admin's sessions start as the server's: a startup parameter
		// overrides the database's default.
		var reset string
		require.NoError(t, admin.QueryRow(ctx, `SELECT reset_val FROM pg_settings WHERE name = $1`, k).Scan(&reset))
		adminCfg.ConnConfig.RuntimeParams[k] = reset
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	ap, err := pgxpool.NewWithConfig(ctx, adminCfg)
	require.NoError(t, err)
	t.Cleanup(ap.Close)
	return &defaultsDB{pool: pool, admin: ap, name: name}
}

// storeLiteralForTest quotes s as an SQL string literal.
func storeLiteralForTest(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// commitLevels reads the synchronous_commit level each commit that wrote
// to the watched tables ran at.
type commitLevels struct {
	pool  *pgxpool.Pool
	table string
}

// recordCommitLevels installs, on each table of schema, a deferred
// constraint trigger that notes the level of synchronous_commit at commit.
func recordCommitLevels(t *testing.T, pool *pgxpool.Pool, schema string, tables ...string) *commitLevels {
	t.Helper()
	s := pgx.Identifier{schema}.Sanitize()
	l := &commitLevels{pool: pool, table: s + ".commit_levels"}
	_, err := pool.Exec(context.Background(), `CREATE TABLE `+l.table+` (n bigserial, tbl text, level text);
		CREATE FUNCTION `+s+`.note_level() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
			INSERT INTO `+l.table+` (tbl, level) VALUES (TG_TABLE_NAME, current_setting('synchronous_commit'));
			RETURN NULL; END $$`)
	require.NoError(t, err)
	for _, tbl := range tables {
		_, err := pool.Exec(context.Background(), `CREATE CONSTRAINT TRIGGER note_level AFTER INSERT OR UPDATE OR DELETE ON `+
			s+`.`+tbl+` DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION `+s+`.note_level()`)
		require.NoError(t, err)
	}
	return l
}

// take returns the levels noted since the last take, and forgets them.
func (l *commitLevels) take(t *testing.T) []string {
	t.Helper()
	rows, err := l.pool.Query(context.Background(), `DELETE FROM `+l.table+` RETURNING tbl || ': ' || level`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return got
}

// expect checks that the write just made committed at least once, every
// time at level.
func (l *commitLevels) expect(t *testing.T, write, level string) {
	t.Helper()
	got := l.take(t)
	if assert.NotEmpty(t, got, "%s: no commit noted", write) {
		for _, g := range got {
			assert.Regexp(t, `: `+level+`$`, g, "%s committed at another level", write)
		}
	}
}
