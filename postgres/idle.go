package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
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
// most once more than that. The pool's size is read only then: its Config
// is a copy, made anew at each call.
func onLiveSession(ctx context.Context, pool *pgxpool.Pool, fn func() error) error {
	for tries := -1; ; tries-- {
		err := fn()
		if err == nil || !endedIdle(err) || ctx.Err() != nil {
			return err
		}
		if tries < 0 {
			tries = int(pool.Config().MaxConns) + 1
		}
		if tries <= 1 {
			return err
		}
	}
}
