package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// TestRegisterWhoseInsertIsInDoubtBehindATransactionPooler: a journal
// with liveness reaches the database through PgBouncer in transaction
// mode (and a proxy that cuts the connection). Register's insert of the
// owner's row waits for the owners table, which another session locked,
// and the connection to the pooler is cut: the insert is in doubt. Once
// the other session lets go, the insert, which the server had whole,
// commits: the owner is registered. Register must say so, and hold the
// owner's liveness lock, not fail (idem.New then fails, and the client is
// not made), nor refuse the name as "registered before" if run again.
func TestRegisterWhoseInsertIsInDoubtBehindATransactionPooler(t *testing.T) {
	t.Parallel()
	p, pool := poolBehindAProxiedPooler(t)
	schema := pgtest.Schema(t)
	j := openOn(t, pool, schema)
	admin := pgtest.Pool(t)
	owners := pgx.Identifier{schema, "owners"}.Sanitize()
	tx, pid := holdIn(t, admin, `LOCK TABLE `+owners+` IN SHARE MODE`)
	var unregister func() error
	err := inDoubtBehindThePooler(t, p, admin, schema, pid, tx.Rollback, func(ctx context.Context) (err error) {
		unregister, err = j.Register(ctx, "worker-1")
		return err
	})
	var rows int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM `+owners+` WHERE name = 'worker-1'`).Scan(&rows))
	t.Logf("register: %v; rows: %d", err, rows)
	if rows == 0 {
		// The pooler's closing of the session aborted the insert: the
		// registration's failure is right.
		assert.Error(t, err)
		return
	}
	require.NoError(t, err, "the owner's row is in: the owner is registered")
	t.Cleanup(func() { assert.NoError(t, unregister()) })
	var locks int
	require.NoError(t, admin.QueryRow(ctx, livenessLocks(schema, "count(*)"), schema+".owners", "worker-1").Scan(&locks))
	assert.Equal(t, 1, locks, "the registered owner holds its liveness lock")
}
