package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// How a write of the journal or the store is committed. Each write sets
// synchronous_commit for its own transaction only (set_config with
// is_local), inside a statement of the transaction, so that it costs no
// round trip, changes nothing of the application's sessions, and works
// through a pooler in transaction mode. The level is set whatever the
// session's default, which the database's or the role's settings
// (ALTER DATABASE / ALTER ROLE ... SET synchronous_commit) may have made
// off: what the promise needs on disk is made durable here, never left to
// the server's configuration.
const (
	// commitDurable waits for the WAL flush: it raises a session whose
	// synchronous_commit is off to on, and leaves every other setting as
	// the application configured it, since each of them (local,
	// remote_write, on, remote_apply) waits for the local flush, and some
	// for a synchronous standby too.
	commitDurable = `SELECT set_config('synchronous_commit',
		CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true)`
	// commitDeferred returns once committed, before the WAL flush.
	commitDeferred = `SELECT set_config('synchronous_commit', 'off', true)`
)

// beginTx begins each transaction of the journal's at read committed,
// whatever the session's default_transaction_isolation (which a role or a
// database may set to repeatable read or serializable): claims race with
// FOR UPDATE SKIP LOCKED and fenced writes re-check their row, which at a
// stronger level fail with "could not serialize access" instead, and the
// liveness transaction, open for the worker's life, would keep its first
// snapshot, and VACUUM's horizon with it, until the worker ends.
const beginTx = `BEGIN ISOLATION LEVEL READ COMMITTED`

// readCommitted is beginTx for pgx's BeginTx.
var readCommitted = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}

// commitLevel is the statement that sets a transaction's commit level:
// commitDurable when any of its writes must be on disk before it returns.
func commitLevel(durable bool) string {
	if durable {
		return commitDurable
	}
	return commitDeferred
}

// level is where a statement of the journal's fast writes (see
// Journal.fastBatch) stands as to its transaction's commit level: the
// statement that commits alone sets it itself, joining commitDurable or
// commitDeferred in its FROM clause, as the store's statements do, in place
// of a statement of its own.
type level uint8

const (
	levelNone     level = iota // set by another statement of the transaction
	levelDeferred              // commitDeferred
	levelDurable               // commitDurable
)

func levelOf(durable bool) level {
	if durable {
		return levelDurable
	}
	return levelDeferred
}

// from is the level's part of a FROM clause: empty, or a one-row subquery
// that sets it, to join with a comma.
func (l level) from() string {
	switch l {
	case levelDurable:
		return `, (` + commitDurable + `) AS lvl`
	case levelDeferred:
		return `, (` + commitDeferred + `) AS lvl`
	}
	return ``
}

// writeTx runs the statements that queue adds to a batch in one
// transaction begun at read committed (see beginTx), committed in the same
// round trip, on a connection of pool: a write of one statement at the
// cost of one, whatever the session's default isolation. An error that
// leaves the commit in doubt comes back as a commitDoubt.
func writeTx(ctx context.Context, pool *pgxpool.Pool, queue func(b *pgx.Batch)) error {
	b := &pgx.Batch{}
	b.Queue(beginTx)
	queue(b)
	b.Queue("COMMIT")
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	err = conn.Conn().SendBatch(ctx, b).Close()
	if err != nil && !conn.Conn().IsClosed() && conn.Conn().PgConn().TxStatus() != 'I' {
		// A statement failed: the server skipped the rest, COMMIT
		// included, and the transaction is left aborted.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_, _ = conn.Conn().Exec(rctx, "ROLLBACK")
		cancel()
	}
	return doubtful(conn.Conn(), err)
}
