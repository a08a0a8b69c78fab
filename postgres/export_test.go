package postgres

import (
	"context"
	"time"

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

// SkewJournalClock makes the journal's process clock read d off the real
// one, as a machine whose clock is wrong would, and measures the server's
// clock against it again. Call it before the journal is used.
func SkewJournalClock(ctx context.Context, j *Journal, d time.Duration) error {
	return skewClock(ctx, j.clock, j.pool, d)
}

// SkewStoreClock is SkewJournalClock for a store.
func SkewStoreClock(ctx context.Context, s *Store, d time.Duration) error {
	return skewClock(ctx, s.clock, s.pool, d)
}

func skewClock(ctx context.Context, c *dbClock, pool *pgxpool.Pool, d time.Duration) error {
	c.mu.Lock()
	c.local = func() time.Time { return time.Now().Add(d) }
	c.measured = time.Time{}
	c.mu.Unlock()
	return c.refresh(ctx, pool)
}

// IdleInTx makes f run where the journal holds a transaction open between
// two round trips (a write's read-then-write transaction; a claim's or a
// renewal's before its commit), with its session's server process: a
// test's stand-in for a process descheduled there.
func IdleInTx(j *Journal, f func(pid uint32)) { j.idleInTx = f }
