package postgres

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// TestStatementsFindRowsThroughTheirIndex: pgx prepares statements, and
// after a few executions PostgreSQL may keep a generic plan, made without
// the parameters' values and, in a new schema, on a table that is empty
// and never analyzed. A statement that finds rows by a join with unnest
// then gets a sequential scan, which it keeps as the table grows (18 ms a
// completion at 20,000 entries). Every statement that finds rows by key
// must find them through the unique index in its generic plan too, on an
// empty table.
func TestStatementsFindRowsThroughTheirIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	pool := pgtest.Pool(t)
	require.NoError(t, MigrateStore(ctx, pool, schema))
	require.NoError(t, MigrateJournal(ctx, pool, schema))
	sq, jq := newStoreQueries(schema), newQueries(schema)

	// A connection of its own, spoken to in the simple protocol: PREPARE
	// and DEALLOCATE would confuse pgx's statement cache.
	conn, err := pgx.Connect(ctx, pgtest.DSN())
	require.NoError(t, err)
	defer conn.Close(ctx)
	for name, tc := range map[string]struct {
		sql, args, table string
	}{
		"store complete":          {sq.complete, `'\x01'::bytea, 1, 2, 201, NULL, NULL`, "store_entries"},
		"store deferred complete": {sq.completeDeferred, `'\x01'::bytea, 1, 2, 201, NULL, NULL`, "store_entries"},
		"journal lock by keys":    {jq.lockByKeys, `ARRAY['a', 'b']`, "operations"},
		"journal lock by ops":     {jq.lockByOps, `ARRAY['s', 's'], ARRAY['a', 'b']`, "operations"},
		"journal renew":           {jq.renew, `'k', 1, 'owner', 2`, "operations"},
		"journal fenced store": {jq.storeFenced[dueKeep][levelDeferred], `1, 2, 1, 0, 3, NULL, 1, NULL, 201, NULL, NULL, NULL, NULL, NULL, 3, NULL, 2, '5',
			3, 2, NULL, 1, NULL, 'owner', 'k', 1`, "operations"},
		"journal fenced settle": {jq.storeFenced[dueDelete][levelDeferred], `1, 4, 1, 0, 3, NULL, 1, NULL, 201, NULL, NULL, NULL, NULL, NULL, 3, NULL, 2, '5',
			3, 2, NULL, 2, NULL, 'owner', 'k', 1, 0`, "due"},
		"journal fenced move": {jq.storeFenced[dueMove][levelNone], `1, 2, 1, 0, 3, NULL, 1, NULL, 201, NULL, NULL, NULL, NULL, NULL, 3, NULL, 2, '5',
			3, 2, NULL, 1, NULL, 'owner', 'k', 1, 0`, "due"},
		"journal due delete":  {jq.dueDelete, `1, 0`, "due"},
		"journal write held":  {jq.writeHeld, `1`, "operations"},
		"journal claim":       {jq.claim, `5, 5, ARRAY['gone'], '', '', 10`, "operations"},
		"journal claim due":   {jq.claim, `5, 5, ARRAY['gone'], '', '', 10`, "due"},
		"journal gone owners": {jq.goneOwners, `5, 5`, "operations"},
		"journal due move":    {jq.dueMove, `1, 0, 5`, "due"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := conn.Exec(ctx, `DEALLOCATE ALL; SET plan_cache_mode = force_generic_plan; PREPARE p AS `+tc.sql, pgx.QueryExecModeSimpleProtocol)
			require.NoError(t, err)
			defer conn.Exec(ctx, `DEALLOCATE ALL; RESET plan_cache_mode`, pgx.QueryExecModeSimpleProtocol) //nolint:errcheck // best effort
			rows, err := conn.Query(ctx, `EXPLAIN EXECUTE p(`+tc.args+`)`, pgx.QueryExecModeSimpleProtocol)
			require.NoError(t, err)
			var plan []string
			for rows.Next() {
				var line string
				require.NoError(t, rows.Scan(&line))
				plan = append(plan, line)
			}
			require.NoError(t, rows.Err())
			text := strings.Join(plan, "\n")
			assert.NotContains(t, text, "Seq Scan on "+tc.table, "the generic plan scans the whole table:\n%s", text)
			assert.Contains(t, text, "Index Scan", "the generic plan:\n%s", text)
		})
	}
}
