package postgres

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// queryCanceled is the SQLSTATE of a statement canceled by
// statement_timeout (or by pg_cancel_backend, which says so otherwise).
const queryCanceled = "57014"

// timeoutAdvice says, after an error that is a statement cut off by the
// session's statement_timeout, what to do; for any other error it is empty.
// The journal and the store set no statement_timeout of their own: a
// session default meant for an application's queries (a role's, or the
// pool's RuntimeParams) applies to theirs, and a busy or locked table can
// make one wait past it.
func timeoutAdvice(err error) string {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != queryCanceled || !strings.Contains(pe.Message, "statement timeout") {
		return ""
	}
	return "; the statement ran past the session's statement_timeout: raise it for the role the pool connects as " +
		"(ALTER ROLE … SET statement_timeout), or for the pool's sessions (RuntimeParams in the pool's configuration, " +
		"or a pool of the journal's own), or find what held the table (a lock, a long migration)"
}

// readOnlyTransaction is the SQLSTATE of a write refused by a read-only
// transaction (read_only_sql_transaction).
const readOnlyTransaction = "25006"

// asReadOnly wraps err, when it is a write refused because the session
// cannot write, with ErrReadOnly, which names what makes it so, and says
// what to do; any other error comes back as it is. The journal and the
// store leave default_transaction_read_only as the operator set it: on for
// the role or the database, it stops their writes as it stops the
// application's (a guard during maintenance, say), and each call that
// needs a write fails, having written nothing, until it is lifted.
func asReadOnly(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != readOnlyTransaction {
		return err
	}
	return fmt.Errorf("%w: %w; nothing was written: point the pool at the primary, or lift the setting, and the same call goes on", ErrReadOnly, err)
}
