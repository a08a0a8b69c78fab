package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrCommitInDoubt reports a write whose commit was sent to the server and
// whose answer never came back (the connection broke, or the call's time
// ran out), and which could not be read back either: it may or may not be
// committed. The error says which write it was. The journal and the store
// read such a write back before they answer; this is what remains when
// even that fails, the database being out of reach.
var ErrCommitInDoubt = errors.New("commit sent, acknowledgement lost")

// A lost acknowledgement. When a COMMIT (or the Sync that ends an implicit
// transaction) has gone out and no answer came back, the transaction may
// have committed or not, and only the database can say. Before anything is
// decided, the session that ran it is waited for until it has no
// transaction open (settle); its writes are then read back, by key and
// version, on another session.

// commitDoubt is the error of a commit that went out without an answer
// from the server: pid is the server process of the session it ran on,
// port the local TCP port of its connection (-1 over a Unix socket), which
// the server knows as the session's client_port.
type commitDoubt struct {
	pid  uint32
	port int32
	err  error
	// byPID: found by its server process alone when the server sees
	// another client port (a TCP proxy or a NAT between them, which pass
	// the server's process number on, unlike a pooler), if it began
	// before began (microseconds since the epoch, on the server's clock)
	// and its last statement names table; see endAbandoned.
	byPID bool
	began int64
	table string
}

// sessionIs is the condition on pg_stat_activity that finds the session
// of a commitDoubt: its parameters are sessionOf's. The session asking is
// never it: a connection back in the pool may be handed to settle itself,
// and it is then running settle's query, nothing of the write.
const sessionIs = `pid = $1 AND pid <> pg_backend_pid() AND (coalesce(client_port, -1) = $2 OR
	($3 AND (extract(epoch FROM backend_start) * 1000000)::bigint < $4 AND position($5 IN query) > 0))`

func (d *commitDoubt) sessionOf() []any {
	return []any{int32(d.pid), d.port, d.byPID, d.began, d.table}
}

func (e *commitDoubt) Error() string { return e.err.Error() }
func (e *commitDoubt) Unwrap() error { return e.err }

// doubtful wraps err, the error of a statement sent on conn that carried a
// commit, as a commitDoubt unless the server answered it: with an error of
// its own (which aborted the transaction), or in full with no row. pgconn.SafeToRetry cannot tell
// that the commit was not sent: a COMMIT whose answer was lost on a
// simple query comes back as "conn closed", which it calls safe.
//
// Not every ErrorResponse is the server's answer to the statement: one
// that says the session was lost (see sessionLost) proves nothing about
// the commit, and is in doubt as a broken connection is.
func doubtful(conn *pgx.Conn, err error) error {
	if err == nil {
		return nil
	}
	var pe *pgconn.PgError
	if (errors.As(err, &pe) && !sessionLost(pe)) || errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	if pgconn.SafeToRetry(err) && !conn.IsClosed() {
		// Refused before anything was written (the context ended before
		// the round trip began), on a connection that lives on: the
		// commit was never sent. (A COMMIT whose answer was lost comes
		// back "safe" too, but on a closed connection.)
		return err
	}
	d := &commitDoubt{pid: conn.PgConn().PID(), port: -1, err: err}
	if a, ok := conn.PgConn().Conn().LocalAddr().(*net.TCPAddr); ok {
		d.port = int32(a.Port)
	}
	return d
}

// sessionLost reports whether pe says the session it came on ended, or
// lost its server, at a moment that proves nothing about a commit sent on
// it. A pooler between the journal and the server answers for a server
// connection it lost itself: PgBouncer sends "server conn crashed?" (and
// "query timeout", "server login retry", "unexpected eof" ...) with
// SQLSTATE 08P01, FATAL, when the server closed the connection, which the
// server does when its session is terminated during a commit, or after
// it; so is any connection exception (class 08). A FATAL ends the session
// whoever sent it, and the server's own (57P01, a terminated session) may
// come after a COMMIT ran, before the round trip's end: only the two the
// server sends before it reads the next statement (57P05, 25P03: nothing
// of it ran, see endedForTx) are proof. Read back, a write that did not
// commit reads so, at the cost of one read.
func sessionLost(pe *pgconn.PgError) bool {
	if strings.HasPrefix(pe.Code, "08") {
		return true
	}
	if pe.Code == idleSessionTimeout || pe.Code == idleInTransactionTimeout {
		return false
	}
	// The server sends its severity unlocalized too (V), a pooler may not.
	sev := pe.SeverityUnlocalized
	if sev == "" {
		sev = pe.Severity
	}
	return sev == "FATAL" || sev == "PANIC"
}

// asDoubt returns err's commitDoubt, or nil.
func asDoubt(err error) *commitDoubt {
	if err == nil {
		return nil // errors.As's target would escape, for nothing
	}
	var d *commitDoubt
	if errors.As(err, &d) {
		return d
	}
	return nil
}

// readBackTimeout bounds how long a write in doubt is waited for and read
// back.
const readBackTimeout = 30 * time.Second

// readBackCtx is the context of a read-back: the caller's values, not its
// end (the commit happened or not, whatever the caller's deadline), bounded
// by readBackTimeout.
func readBackCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), readBackTimeout)
}

// settle waits until the session of a commit in doubt has no transaction
// open, so that whatever it committed is visible to another session and
// whatever it did not commit never will be: the session ended, or it is
// idle. A session idle in a transaction never received its COMMIT (the
// network lost it on the way): it is terminated, which rolls its
// transaction back, rather than left to hold its row locks until the
// server notices the client gone. A session still running the commit
// (waiting for its WAL flush, or for a synchronous standby) is waited for.
//
// The session is known by its server process and its client port, so that
// no other session is ever waited for or ended: behind a pooler or a proxy
// the server sees another port (and a pooler hands out process numbers of
// its own), the session is not found, and the read-back reads at once. A
// commit still running then may read as not committed; the write runs
// again, and the journal's rules refuse what would repeat it (a create
// finds its operation, an update finds its version taken). Run again, the
// write waits for the first where that one still holds or waits for the
// row (the row's lock, the key's uniqueness check), and a row that is
// what the first sent (writeReq.doubted) is the write's own result: a
// create that created it, an update that made it. So for the store's
// claims: the write (an insert, a replacement, a take-over) runs again in
// the claim's next round, and an entry that is what the first left is the
// claim's (claimedAt).
func settle(ctx context.Context, pool *pgxpool.Pool, d *commitDoubt) error {
	pid := d.pid
	wait := 2 * time.Millisecond
	for {
		var state, waits *string
		// Each statement may run again on another session (see
		// endedForRead): the read changes nothing, and ending or
		// canceling a session already ended does nothing.
		err := onLiveSessionRead(ctx, pool, func() error {
			return pool.QueryRow(ctx, `SELECT state, wait_event_type FROM pg_stat_activity WHERE `+sessionIs,
				d.sessionOf()...).Scan(&state, &waits)
		})
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return nil
		case err != nil:
			return err
		case state != nil && *state == "idle":
			return nil
		case state != nil && *state == "active" && waits != nil && *waits == "Lock":
			// Waiting for a lock another session holds (a row's), as when
			// the write's time ran out on it: its client is gone, and the
			// server notices only once the lock is granted, which may take
			// as long as the holder likes. A statement that waits for a
			// lock has not committed: it is canceled, which rolls its
			// transaction back; should the lock come first, the commit
			// goes through, interrupts held, and the read-back finds it.
			if err := onLiveSessionRead(ctx, pool, func() error {
				_, err := pool.Exec(ctx, `SELECT pg_cancel_backend(pid) FROM pg_stat_activity
					WHERE `+sessionIs+` AND state = 'active' AND wait_event_type = 'Lock'`, d.sessionOf()...)
				return err
			}); err != nil {
				return err
			}
		case state != nil && (*state == "idle in transaction" || *state == "idle in transaction (aborted)"):
			if err := onLiveSessionRead(ctx, pool, func() error {
				_, err := pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
					WHERE `+sessionIs+` AND state LIKE 'idle in transaction%'`, d.sessionOf()...)
				return err
			}); err != nil {
				return err
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("the session that ran it (server process %d) still runs it: %w", pid, ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, 100*time.Millisecond)
	}
}

// inDoubt is the error of a write in doubt that could not be read back:
// what names the write (and where it was), readBack says why it could not.
func inDoubt(what string, lost, readBack error) error {
	return fmt.Errorf("%s: %w (%v), and reading it back failed: %v; it may or may not be committed: read it again once the database answers",
		what, ErrCommitInDoubt, lost, readBack)
}
