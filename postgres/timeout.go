package postgres

import (
	"errors"
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
