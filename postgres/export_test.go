package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres/internal/pgschema"
)

// For the naive journal of journal_bench_test.go, BenchmarkDo's baseline:
// it writes the same rows as Journal, with the same columns, scanner and
// insert, and differs only in committing every write on its own.

// RecordColumns are the columns ScanRecord reads, in its order.
const RecordColumns = recordColumns

// ScanRecord reads a row of RecordColumns: the row's id and its record.
var ScanRecord = scanRecord

// QueueInsert queues the journal's insert of a new record with its
// creation event: one statement, which inserts nothing when (scope, op_id)
// exists.
func (j *Journal) QueueInsert(b *pgx.Batch, rec idem.Record, ev idem.Event) *pgx.QueuedQuery {
	return j.q.queueInsert(b, rec, ev)
}

// MigrateJournalTo migrates the journal's tables in schema up to version,
// as an older idem left them: for the tests of later migrations.
func MigrateJournalTo(ctx context.Context, pool *pgxpool.Pool, schema string, version int) error {
	k := journalKind
	k.Migrations = k.Migrations[:version]
	return pgschema.Migrate(ctx, pool, schema, k)
}

// MigrateStoreTo migrates the store's tables in schema up to version, as
// an older idem left them: for the tests of later migrations.
func MigrateStoreTo(ctx context.Context, pool *pgxpool.Pool, schema string, version int) error {
	k := storeKind
	k.Migrations = k.Migrations[:version]
	return pgschema.Migrate(ctx, pool, schema, k)
}
