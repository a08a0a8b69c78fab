package postgres_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// TestJournalBehindAStatementPoolerSaysWhy: PgBouncer in statement mode
// refuses transactions, which the journal needs for its migrations and
// its writes. Opening it there fails with an error that says so and what
// to do, not with the pooler's words alone.
func TestJournalBehindAStatementPoolerSaysWhy(t *testing.T) {
	t.Parallel()
	bouncer := pgtest.StartBouncerWith(t, "pool_mode = statement")
	pool, err := pgxpool.New(ctx, bouncer.DSN())
	require.NoError(t, err)
	defer pool.Close()
	_, err = postgres.OpenJournal(ctx, pool, postgres.Schema(pgtest.Schema(t)), postgres.WithoutLiveness())
	require.Error(t, err)
	t.Logf("the error: %v", err)
	assert.Contains(t, err.Error(), "postgres journal in schema", "it names the journal")
	assert.Contains(t, err.Error(), "statement pooling mode")
	assert.Contains(t, err.Error(), "pool_mode = transaction", "it says what to use instead")
}
