package postgres_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgschema"
)

// OpenJournal's check of INSERT on server_up must follow role membership:
// a workers' role given the documented privileges through a group role
// (GRANT group TO workers, the usual way to grant a fleet) may insert, so
// it must not be refused. A guard: held when written.
func TestOpenAcceptsInsertOnServerUpGrantedThroughARoleMembership(t *testing.T) {
	t.Parallel()
	grants := strings.ReplaceAll(documentedGrants, "TO workers", "TO workers_group")
	schema, pool, admin := workersRole(t, "SELECT 1")
	var role string
	require.NoError(t, pool.QueryRow(ctx, `SELECT current_user`).Scan(&role))
	group := role + "_group"
	_, err := admin.Exec(ctx, `CREATE ROLE `+group+` NOLOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(ctx, `DROP OWNED BY `+group+`; DROP ROLE `+group) })
	grants = strings.NewReplacer(" idem.", " "+pgschema.Ident(schema)+".", "SCHEMA idem ", "SCHEMA "+pgschema.Ident(schema)+" ", "TO workers_group", "TO "+group).Replace(grants)
	_, err = admin.Exec(ctx, grants+`; GRANT `+group+` TO `+role)
	require.NoError(t, err)
	j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema), postgres.WithoutMigration())
	require.NoError(t, err, "a role that may insert into server_up through its group is not refused")
	require.NoError(t, j.Close())
}

// A role granted INSERT on server_up but not SELECT passes OpenJournal's
// check (has_table_privilege INSERT), yet every liveness judgement reads
// server_up (the judge's "SELECT at FROM server_up"): the judgement that
// the check was added to keep working fails with "permission denied",
// and a Claim while another worker holds a lease fails, which stops a
// fleet resuming anything (the review-3 failure the doc's grants fixed).
// The refusal's own advice ("run GRANT INSERT ON ….server_up") leads to
// exactly this role when SELECT was missing too. Correct: OpenJournal
// refuses it, naming SELECT as well (or the judgement needs no SELECT).
func TestOpenRefusesARoleThatMayInsertIntoServerUpButNotSelect(t *testing.T) {
	t.Parallel()
	grants := strings.Replace(documentedGrants, "GRANT SELECT, INSERT ON idem.server_up", "GRANT INSERT ON idem.server_up", 1)
	require.NotEqual(t, documentedGrants, grants)
	schema, pool, _ := workersRole(t, grants)
	jb, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema), postgres.WithoutMigration(), postgres.LivenessGrace(time.Second))
	if err != nil {
		assert.Contains(t, err.Error(), "SELECT", "the refusal names the missing SELECT")
		return
	}
	defer jb.Close()
	keys := createRecords(t, jb, 1)
	kill := startHolder(t, schema, "worker-a", time.Hour, true, keys...)
	defer kill()
	unregister, err := jb.Register(ctx, "worker-b")
	require.NoError(t, err)
	defer unregister()
	_, err = jb.Claim(ctx, idem.ClaimRequest{Owner: "worker-b", Limit: 10, Lease: time.Hour})
	assert.NoError(t, err, "OpenJournal accepted the role: its claims while another worker holds a lease must work")
}

// A role granted INSERT on server_up's columns (GRANT INSERT (id, at)),
// not on the table, may run the journal's insert into it, every column
// of which it names; OpenJournal's check asks has_table_privilege, which
// counts no column privilege, and refuses it. Correct: a role that may
// run the insert opens (has_any_column_privilege, or the columns'
// privilege, would say so).
func TestOpenAcceptsInsertOnServerUpsColumns(t *testing.T) {
	t.Parallel()
	grants := strings.Replace(documentedGrants, "GRANT SELECT, INSERT ON idem.server_up", "GRANT SELECT, INSERT (id, at) ON idem.server_up", 1)
	require.NotEqual(t, documentedGrants, grants)
	schema, pool, _ := workersRole(t, grants)
	_, err := pool.Exec(ctx, `INSERT INTO `+pgschema.Ident(schema)+`.server_up (id, at) VALUES (1, 0) ON CONFLICT (id) DO NOTHING`)
	require.NoError(t, err, "the role may run the journal's insert into server_up")
	j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema), postgres.WithoutMigration())
	require.NoError(t, err, "a role that may insert into server_up's columns is not refused")
	require.NoError(t, j.Close())
}
