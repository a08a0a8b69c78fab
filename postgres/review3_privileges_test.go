package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgschema"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// Review (issue 22): a team that migrates apart (MigrateJournal as the
// schema's owner, WithoutMigration in the workers, as the package doc
// offers) grants the workers' role what the doc's "Tables" paragraph names:
// operations, events, owners, sync and idem_schema. The doc promises that a
// killed worker's operations are taken a LivenessGrace after it is gone,
// and that the grace counts from when the server was found up "whatever
// the privileges of the journal's role".
//
// What happens: migration 6 added a table the doc's list does not name,
// the unlogged server_up, and every liveness judgement INSERTs into it
// (ON CONFLICT DO NOTHING, which needs INSERT even when the row exists).
// For a role granted the documented tables, every judgement fails with
// "permission denied for table server_up": Claim (Resume) returns that
// error as long as another owner holds a live lease on a due operation,
// so a fleet stops resuming anything, and the killed worker's operation
// is never taken before its lease lapses.
func TestReview3ClaimWithARoleGrantedTheDocumentedTables(t *testing.T) {
	t.Parallel()
	admin := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	require.NoError(t, postgres.MigrateJournal(ctx, admin, schema))
	var b [4]byte
	_, _ = rand.Read(b[:])
	role := "idem_review3_" + hex.EncodeToString(b[:])
	s := pgschema.Ident(schema)
	_, err := admin.Exec(ctx, `CREATE ROLE `+role+` LOGIN`)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `GRANT USAGE ON SCHEMA `+s+` TO `+role+`;
		GRANT SELECT, INSERT, UPDATE, DELETE ON `+s+`.operations, `+s+`.events, `+s+`.owners, `+s+`.sync, `+s+`.idem_schema TO `+role+`;
		GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA `+s+` TO `+role)
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(pgtest.DSN())
	require.NoError(t, err)
	cfg.ConnConfig.User = role
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		pool.Close()
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = admin.Exec(c, `DROP SCHEMA IF EXISTS `+s+` CASCADE`)
		_, _ = admin.Exec(c, `DROP OWNED BY `+role+`; DROP ROLE `+role)
	})

	jb, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema), postgres.WithoutMigration(), postgres.LivenessGrace(time.Second))
	require.NoError(t, err, "the workers' role opens the journal migrated apart")
	defer jb.Close()
	keys := createRecords(t, jb, 1)
	kill := startHolder(t, schema, "worker-a", time.Hour, true, keys...)
	unregister, err := jb.Register(ctx, "worker-b")
	require.NoError(t, err)
	defer unregister()

	recs, err := jb.Claim(ctx, idem.ClaimRequest{Owner: "worker-b", Limit: 10, Lease: time.Hour})
	require.NoError(t, err, "a claim while another worker holds a lease")
	assert.Empty(t, recs, "a live worker's operation is not taken")

	kill()
	deadline := time.Now().Add(30 * time.Second)
	for {
		recs, err := jb.Claim(ctx, idem.ClaimRequest{Owner: "worker-b", Limit: 10, Lease: time.Hour})
		require.NoError(t, err, "a claim after the worker holding a lease was killed")
		if len(recs) == 1 {
			assert.Equal(t, keys[0], recs[0].Key)
			return
		}
		require.True(t, time.Now().Before(deadline), "the killed worker's operation (lease an hour) is not taken 30 s after SIGKILL, with a grace of 1 s")
		time.Sleep(50 * time.Millisecond)
	}
}
