package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// endAbandoned ends, in the background, the server session of conn when a
// transaction on it failed (err) with the connection closed under it, its
// commit not in doubt: the network broke it, or the call's time ran out
// and pgx closed it, before the commit was sent. The server may not know:
// a network that lost its state (a NAT's, a firewall's) carries neither
// the client's end nor the cancel request pgx sends as it closes a
// connection whose context ended (and that one, should it pass, does
// nothing to a session idle in its transaction, as one is whose lock wait
// ended as the client gave up). Such a session keeps every row lock its
// transaction took until the server's TCP keepalive gives up on the
// client (two hours by default) or idle_in_transaction_session_timeout
// (off by default) ends it; meanwhile every write of those rows, by any
// process, waits for it. settle cancels its wait for a lock, or
// terminates it idle in its transaction, and leaves it alone otherwise.
// A commit in doubt is settled by its read-back, on the caller's path.
//
// The session is found by its server process and client port, or, when
// the server sees another port (a TCP proxy or a NAT), by its process
// alone if this journal's connections carry the server's process numbers
// (serverPIDs: no pooler, which makes up its own, between them), the
// session began before the transaction did (began, on this process's
// clock moved onto the server's: not a later session given the same
// number; one opened by this very Acquire began at least a round trip
// before it returned, more than the clock's error, half of one), and its last
// statement was on this journal's table. Behind a pooler it is not found:
// the pooler ends its server session as the client's ends.
//
// The caller does not wait: its write has failed, nothing of it committed,
// and the writes that run again alone wait for the rows only until the
// session ends. The ending is bounded (readBackTimeout), and Close stops
// it (life).
func (j *Journal) endAbandoned(conn *pgx.Conn, began time.Time, err error) {
	if err == nil || !conn.IsClosed() || asDoubt(err) != nil || pgconn.SafeToRetry(err) {
		// No error, a session pgx still knows the state of (it rolled
		// back), a commit in doubt, or nothing sent.
		return
	}
	d := asDoubt(doubtful(conn, err))
	if d == nil {
		return // the server's answer: it ended the session itself
	}
	d.began = began.Add(j.off()).UnixMicro()
	d.table = j.q.operations
	j.watched.Add(1)
	go func() {
		defer j.watched.Done()
		ctx, cancel := context.WithTimeout(j.life, readBackTimeout)
		defer cancel()
		d.byPID = j.serverPIDs(ctx)
		// Best effort: the write's error is its caller's already, and a
		// database that does not answer this does not answer the write
		// run again either, which then reports it.
		_ = settle(ctx, j.pool, d)
	}()
}

// serverPIDs reports whether the process numbers this journal's
// connections report are the server's own (BackendKeyData): not when a
// pooler (PgBouncer, which makes up its own) stands between them. Asked
// once, of a connection of the pool, the first time a session is
// abandoned; false when it cannot be told.
func (j *Journal) serverPIDs(ctx context.Context) bool {
	switch j.pids.Load() {
	case 1:
		return true
	case 2:
		return false
	}
	conn, err := j.pool.Acquire(ctx)
	if err != nil {
		return false
	}
	defer conn.Release()
	var pid int32
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return false
	}
	same := uint32(pid) == conn.Conn().PgConn().PID()
	if same {
		j.pids.Store(1)
	} else {
		j.pids.Store(2)
	}
	return same
}
