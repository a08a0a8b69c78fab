package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
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

// The grants the package doc's Privileges paragraph gives a workers' role,
// for the schema "idem" and the role "workers".
const documentedGrants = `GRANT USAGE ON SCHEMA idem TO workers;
GRANT SELECT, INSERT, UPDATE, DELETE ON idem.operations, idem.due, idem.events, idem.owners, idem.sync TO workers;
GRANT SELECT, INSERT ON idem.server_up TO workers;
GRANT SELECT ON idem.idem_schema TO workers;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA idem TO workers;`

// workersRole migrates a schema apart and returns it, with a pool of a new
// role granted grants (documentedGrants' form, the schema and the role
// put in), and the administrator's pool.
func workersRole(t *testing.T, grants string) (string, *pgxpool.Pool, *pgxpool.Pool) {
	t.Helper()
	admin := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	require.NoError(t, postgres.MigrateJournal(ctx, admin, schema))
	var b [4]byte
	_, _ = rand.Read(b[:])
	role := "idem_review3_" + hex.EncodeToString(b[:])
	s := pgschema.Ident(schema)
	_, err := admin.Exec(ctx, `CREATE ROLE `+role+` LOGIN`)
	require.NoError(t, err)
	grants = strings.NewReplacer(" idem.", " "+s+".", "SCHEMA idem ", "SCHEMA "+s+" ", "TO workers", "TO "+role).Replace(grants)
	_, err = admin.Exec(ctx, grants)
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
	return schema, pool, admin
}

// claimUntilTaken claims as worker-b until it takes key, within 30 s.
func claimUntilTaken(t *testing.T, j *postgres.Journal, key string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		recs, err := j.Claim(ctx, idem.ClaimRequest{Owner: "worker-b", Limit: 10, Lease: time.Hour})
		require.NoError(t, err, "a claim after the worker holding a lease was killed")
		if len(recs) == 1 {
			assert.Equal(t, key, recs[0].Key)
			return
		}
		require.True(t, time.Now().Before(deadline), "the killed worker's operation (lease an hour) is not taken 30 s after SIGKILL, with a grace of 1 s")
		time.Sleep(50 * time.Millisecond)
	}
}

// Review (issue 22): a team that migrates apart (MigrateJournal as the
// schema's owner, WithoutMigration in the workers, as the package doc
// offers) grants the workers' role what the doc says. The doc promises
// that a killed worker's operations are taken a LivenessGrace after it is
// gone.
//
// What happened: migration 6 added a table the doc's list did not name,
// the unlogged server_up, and every liveness judgement INSERTed into it.
// For a role granted the documented tables, every judgement failed with
// "permission denied for table server_up": Claim (Resume) returned that
// error as long as another owner held a live lease on a due operation, so
// a fleet stopped resuming anything. The doc now names every table and
// the grants each needs.
func TestReview3ClaimWithARoleGrantedTheDocumentedTables(t *testing.T) {
	t.Parallel()
	schema, pool, _ := workersRole(t, documentedGrants)
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
	claimUntilTaken(t, jb, keys[0])
}

// withoutInsertOnServerUp is documentedGrants but INSERT on server_up.
func withoutInsertOnServerUp(t *testing.T) string {
	grants := strings.Replace(documentedGrants, "GRANT SELECT, INSERT ON idem.server_up", "GRANT SELECT ON idem.server_up", 1)
	require.NotEqual(t, documentedGrants, grants)
	return grants
}

// A journal with liveness opened by a role without INSERT on server_up
// would judge owners without it, silently slow to take a killed worker's
// operations after a crash recovery or a promotion (see
// TestReview3ClaimWithoutInsertOnServerUp): OpenJournal refuses it, saying
// which grant is missing and what it costs. A journal that does not judge
// (ReadOnly, WithoutLiveness) needs no such grant, and opens.
func TestOpenRefusesARoleWithoutInsertOnServerUp(t *testing.T) {
	t.Parallel()
	schema, pool, _ := workersRole(t, withoutInsertOnServerUp(t))
	_, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema), postgres.WithoutMigration())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "GRANT SELECT, INSERT ON "+pgschema.Ident(schema)+".server_up")
	assert.Contains(t, err.Error(), "leases lapse")
	for name, opt := range map[string]postgres.Option{"ReadOnly": postgres.ReadOnly(), "WithoutLiveness": postgres.WithoutLiveness()} {
		j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema), postgres.WithoutMigration(), opt)
		if assert.NoError(t, err, name) {
			assert.NoError(t, j.Close())
		}
	}
}

// A role that lost INSERT on server_up once its journal was open degrades
// rather than stopping the fleet: its claims work, and while server_up is
// empty (as after a crash recovery, or a promotion) a killed worker's
// operation is left to its lease, for the judgement cannot tell the
// worker's absence from the server's downtime; once a role that may
// insert has filled server_up, the operation is taken after the grace.
func TestReview3ClaimWithoutInsertOnServerUp(t *testing.T) {
	t.Parallel()
	schema, pool, admin := workersRole(t, documentedGrants)
	const grace = time.Second
	jb, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema), postgres.WithoutMigration(), postgres.LivenessGrace(grace))
	require.NoError(t, err)
	defer jb.Close()
	var role string
	require.NoError(t, pool.QueryRow(ctx, `SELECT current_user`).Scan(&role))
	_, err = admin.Exec(ctx, `REVOKE INSERT ON `+pgschema.Ident(schema)+`.server_up FROM `+pgschema.Ident(role))
	require.NoError(t, err)
	keys := createRecords(t, jb, 1)
	kill := startHolder(t, schema, "worker-a", time.Hour, true, keys...)
	unregister, err := jb.Register(ctx, "worker-b")
	require.NoError(t, err)
	defer unregister()

	var up int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM `+pgschema.Ident(schema)+`.server_up`).Scan(&up))
	require.Zero(t, up, "server_up is empty, as after a crash recovery")
	kill()
	// The judgement counts from now while server_up is empty: claims for
	// three graces take nothing, and fail not.
	for until := time.Now().Add(3 * grace); time.Now().Before(until); time.Sleep(100 * time.Millisecond) {
		recs, err := jb.Claim(ctx, idem.ClaimRequest{Owner: "worker-b", Limit: 10, Lease: time.Hour})
		require.NoError(t, err, "a claim by a role without INSERT on server_up")
		require.Empty(t, recs, "the killed worker's operation is left to its lease while server_up is empty")
		_, err = jb.Acquire(ctx, keys[0], "worker-b", time.Hour)
		require.ErrorIs(t, err, idem.ErrLeased)
	}
	_, err = admin.Exec(ctx, `INSERT INTO `+pgschema.Ident(schema)+`.server_up (id, at) VALUES (1, (extract(epoch FROM clock_timestamp()) * 1000)::bigint)`)
	require.NoError(t, err, "a role that may insert fills server_up")
	claimUntilTaken(t, jb, keys[0])
}
