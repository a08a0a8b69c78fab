package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/postgres/internal/pgschema"
)

// idleSessionTimeout is the SQLSTATE with which the server ends a session
// that stayed idle (outside a transaction) for idle_session_timeout.
const idleSessionTimeout = "57P05"

// endedIdle reports whether err is the server's notice that it had ended
// the session for idling past idle_session_timeout. The server sends it as
// it ends the session, before the statement that meets it was read, so
// none of that statement ran: it may be sent again on another session.
//
// A role or a database may set idle_session_timeout below the idle time
// after which pgxpool checks a connection before handing it out (one
// second by default): a connection of the application's pool that idled
// between the two is handed out ended, and the first statement on it
// fails so.
func endedIdle(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == idleSessionTimeout
}

// onLiveSession runs fn, and runs it again while it meets a session the
// server ended for idling (see endedIdle): the pool drops each such
// connection, and may hold as many as it has connections, so fn runs at
// most twice more than that: once on a new session, and once more should
// that one idle past a short idle_session_timeout before its first
// statement (a process descheduled under load). The pool's size is read
// only then: its Config is a copy, made anew at each call.
func onLiveSession(ctx context.Context, pool *pgxpool.Pool, fn func() error) error {
	return retryEnded(ctx, pool, endedIdle, fn)
}

// idleInTransactionTimeout is the SQLSTATE with which the server ends a
// session that stayed idle in a transaction for
// idle_in_transaction_session_timeout.
const idleInTransactionTimeout = "25P03"

// endedIdleInTx reports whether err is the server's notice that it had
// ended the session for idling in a transaction past
// idle_in_transaction_session_timeout. The server sends it while it waits
// for the client's next statement, before reading it: the transaction was
// rolled back and nothing sent after it ran, so a transaction that met it
// may run again, from its beginning, on another session. A journal's
// write meets it when its process is descheduled between the round trips
// of a transaction (readBatch) for longer than a short timeout.
func endedIdleInTx(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == idleInTransactionTimeout
}

// endedForTx reports whether err is that of a session the server ended
// before a transaction on it committed anything: ended for idling (before
// the transaction began), or for idling in the transaction, between its
// round trips (see endedIdleInTx).
func endedForTx(err error) bool {
	return endedIdle(err) || endedIdleInTx(err)
}

// adminShutdown is the SQLSTATE with which the server ends a session
// that pg_terminate_backend (an administrator, a tool that reaps idle
// sessions) or a shutdown of the server ended.
const adminShutdown = "57P01"

// endedForRead reports whether err is that of a session that ended before
// or while a read ran on it: ended for idling, terminated (adminShutdown,
// which, unlike 57P05, may come in the middle of a statement), or broken
// (before anything of the statement was sent, pgconn.SafeToRetry; or after:
// the connection closed or reset under it, as when the network cut a
// session that idled, found by the pool only after a second). A read
// changes nothing, so it may run again on another session whichever it
// was; a write may not, as the statement may have run (see indoubt.go).
// A connection that could not be opened, or timed out, is not retried:
// the server is down or silent, and another try would wait as long.
func endedForRead(err error) bool {
	if endedIdle(err) || pgconn.SafeToRetry(err) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == adminShutdown
	}
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// onLiveSessionRead is onLiveSession for fn that only reads: it runs again
// on another session too when its session was terminated or broken (see
// endedForRead).
func onLiveSessionRead(ctx context.Context, pool *pgxpool.Pool, fn func() error) error {
	return retryEnded(ctx, pool, endedForRead, fn)
}

func retryEnded(ctx context.Context, pool *pgxpool.Pool, ended func(error) bool, fn func() error) error {
	for tries := -1; ; tries-- {
		err := fn()
		if err == nil || !ended(err) {
			return err
		}
		if cerr := ctx.Err(); cerr != nil {
			// Nothing more ran; what stopped the call is its context,
			// which errors.Is finds and the message ends with.
			return fmt.Errorf("%w, and the call's context ended before it could run again on another session: %w", err, cerr)
		}
		if tries < 0 {
			tries = int(pool.Config().MaxConns) + 2
		}
		if tries <= 1 {
			return err
		}
	}
}

// migrate runs kind's migrations in schema (pgschema.Migrate), and runs
// them again on another session when the server ended the session before
// the migration's transaction committed (see endedForTx): a connection
// handed out after idling past a short idle_session_timeout, the first
// statement of opening a journal or a store. The transaction was rolled
// back; run again, it finds the version it left and does the rest.
func migrate(ctx context.Context, pool *pgxpool.Pool, schema string, kind pgschema.Kind) error {
	return retryEnded(ctx, pool, endedForTx, func() error { return pgschema.Migrate(ctx, pool, schema, kind) })
}
