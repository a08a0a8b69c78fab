package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/postgres/internal/pgschema"
)

// An owner's liveness lock is the advisory lock (owners, id): the first key
// is the OID of the schema's owners table, the second the owner's number
// in it. Owners are numbered from 1 in every schema; the table's OID, unique
// in the database, keeps the journals of two schemas from taking each
// other's locks (and so from seeing a dead owner alive, or waiting on a
// live one of the other schema to register).
//
// A free lock alone does not make its owner gone: the session that held it
// may have ended while the owner lives on (an administrator's
// pg_terminate_backend, a restart of the database, a pooler or a server
// setting that closed the connection), and the owner then takes its lock
// again on a new session at once (see watch). So an owner is gone when it
// ended its registration (ended_at), or when its lock has stayed free, in
// one and the same session, for the journal's LivenessGrace on the
// database's clock. The first journal to find the lock free marks the
// owner lost in the session it read (lost_session, lost_at); each session
// the owner takes increments session, which voids the mark, and a journal
// that finds the lock held clears it. A mark counts from when the server
// was last found up at the earliest (server_up, see judge). Nothing of the
// judgement is kept in memory: an owner found gone once is judged afresh
// the next time, and an owner whose lock is held again is alive.
//
// The order of reads and writes is what makes the mark sound. An owner
// takes its lock, then increments session. A judgement reads the owners'
// rows (the statement's snapshot, taken when it starts) before it reads
// pg_locks (while it runs). A judgement that read session n therefore read
// pg_locks after the lock of session n was taken: if it found the lock
// free, session n had ended, and a mark for n says so truly; one made for
// an older session than the current one counts for nothing.

// livenessClass is the first key of the schema's liveness locks: the
// owners table's OID, as the signed int4 that pg_advisory_lock takes.
func (j *Journal) livenessClass() int32 { return int32(j.ownersOID) }

// dbMillis is the database's clock in the journal's unit.
const dbMillis = `(extract(epoch FROM clock_timestamp()) * 1000)::bigint`

// ownerQueries sets the statements of owners and their liveness; s is the
// quoted schema.
func (q *queries) ownerQueries(s string) {
	owners := s + ".owners"
	// The lock numbers held in this database of the class $1.
	held := `held AS MATERIALIZED (SELECT l.objid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted
		AND l.classid = $1::bigint::oid AND l.objsubid = 2
		AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))`
	// Run on the session that has just taken the lock of owner $1, named
	// $2: a new session for the owner. The row is written again if it was
	// swept while the owner had no session, with the owner's number, which
	// its lock and its leases' judgements go by.
	q.newSession = `INSERT INTO ` + owners + ` (id, name, registered_at) OVERRIDING SYSTEM VALUE VALUES ($1, $2, $3)
		ON CONFLICT (id) DO UPDATE SET session = owners.session + 1`
	// Ends owner $1, named $2. Run again (ending through the pool after
	// the liveness session failed, or after its COMMIT's answer was lost),
	// it keeps the first end's time: it is its own read-back. The row is
	// written again, ended, if a sweep removed it while the owner had no
	// session (as newSession does): an owner without a row is never judged
	// gone, and the leases it took meanwhile would wait for their lapse.
	q.endOwner = `INSERT INTO ` + owners + ` (id, name, registered_at, ended_at) OVERRIDING SYSTEM VALUE
		VALUES ($1, $2, ` + dbMillis + `, ` + dbMillis + `)
		ON CONFLICT (id) DO UPDATE SET ended_at = coalesce(owners.ended_at, EXCLUDED.ended_at)`
	// The owners among $2 that are gone, with LivenessGrace $3 in
	// milliseconds. Those whose lock is free and that carry no mark for
	// their session get one; those whose lock is held lose theirs. A row
	// another transaction holds is left as it is this time (a mark only
	// starts the grace; a mark left on a live owner is voided by the
	// session it records next, or cleared by the next judgement).
	//
	// A mark is cleared when the lock is found held because the owner
	// takes its lock before it records its new session: should it lose
	// the lock again in between, a mark of the session before would
	// count the time it held it as absence.
	//
	// While the database is down no owner can hold a lock: its downtime is
	// nobody's absence, and a mark made before it counts from when the
	// server was last found up at the earliest. A clean restart moves the
	// postmaster's start, which any role may read. A crash recovery
	// (after an immediate stop, or after one backend's crash, when the
	// postmaster reinitialises and keeps its start) empties the unlogged
	// table server_up, and a promoted standby has it empty; a judgement
	// that finds it empty counts from now, and says so (its last row, with
	// a NULL name), and the journal then writes the database's time in it
	// (insertUp). So the grace counts from a moment the server took
	// connections, whatever the role and however it came back. The insert
	// is a statement of its own, run only when the table is empty, so that
	// a role without INSERT on server_up judges while the row is there
	// (see errServerUpPrivilege).
	q.judge = `WITH ` + held + `,
		began AS MATERIALIZED (SELECT at FROM ` + s + `.server_up WHERE id = 1),
		up AS MATERIALIZED (SELECT greatest((extract(epoch FROM pg_postmaster_start_time()) * 1000)::bigint,
			coalesce((SELECT at FROM began), ` + dbMillis + `)) AS at),
		o AS MATERIALIZED (SELECT id, name, session, ended_at, lost_session = session AS lost,
			greatest(lost_at, (SELECT at FROM up)) AS lost_at,
			id::oid IN (SELECT objid FROM held) AS live, ` + dbMillis + ` AS now
			FROM ` + owners + ` WHERE name = ANY($2)),
		marked AS (UPDATE ` + owners + ` u SET lost_session = CASE WHEN o.live THEN NULL ELSE u.session END,
			lost_at = CASE WHEN o.live THEN NULL ELSE o.now END
			FROM o WHERE u.id = o.id AND u.id IN (SELECT x.id FROM ` + owners + ` x JOIN o ON x.id = o.id
				WHERE CASE WHEN o.live THEN x.lost_session IS NOT NULL
					ELSE o.ended_at IS NULL AND x.session = o.session AND x.lost_session IS DISTINCT FROM x.session END
				FOR UPDATE OF x SKIP LOCKED))
		SELECT name FROM o WHERE NOT live AND (ended_at IS NOT NULL
			OR (CASE WHEN lost THEN lost_at ELSE now END) <= now - $3)
		UNION ALL SELECT NULL WHERE NOT EXISTS (SELECT 1 FROM began)`
	q.insertUp = `INSERT INTO ` + s + `.server_up (id, at) VALUES (1, ` + dbMillis + `) ON CONFLICT (id) DO NOTHING`
	// Owners whose lock is free and that hold no live lease ($2: now) are
	// of no use to anyone: a judgement of an owner without a row finds it
	// not gone, and it holds nothing to judge. A live owner without a
	// session writes its row again when it takes its lock (newSession).
	// held is read once, when the statement begins: a row that an owner's
	// new session changed since (newSession counts sessions), which the
	// DELETE meets again in its newest form once the transaction that
	// held it ends, is not the row judged free, and stays (seen).
	q.sweep = `WITH ` + held + `, seen AS MATERIALIZED (SELECT id, session FROM ` + owners + `)
		DELETE FROM ` + owners + ` o
		WHERE NOT (o.id::oid IN (SELECT objid FROM held)) AND (o.id, o.session) IN (SELECT id, session FROM seen)
		AND o.name NOT IN (SELECT a.lease_owner FROM ` + q.due + ` d JOIN ` + q.operations + ` a ON a.id = d.id
			WHERE a.state IN (1, 2, 3) AND a.lease_owner IS NOT NULL AND a.lease_expires_at > $2)`
}

// registration is an owner registered through this journal: the session
// that holds its liveness lock belongs to the goroutine that watches it.
type registration struct {
	owner string
	id    int32
	stop  context.CancelFunc
	done  chan struct{} // closed when the watcher returned
	conn  *pgx.Conn     // the session the watcher held last, once done; nil if none

	// ending is held by the call that ends the registration (unregister,
	// Close): another waits for it, and finds ended set if it ended.
	ending sync.Mutex
	ended  bool
}

// Register implements idem.Journal. The owner's name goes into the owners
// table (a name is registered once, ever), and the journal opens a
// connection of the owner's own, outside the pool, for as long as the
// owner is registered, holding an advisory lock on the owner's number in a
// transaction left open (see takeLiveness). PostgreSQL drops the lock when
// that transaction's session ends, however the worker ended: that is how
// the others see it gone. Should the session end while the worker lives
// on, the journal takes the lock again at once on a new connection of its
// own. The connection is closed on unregister and by Close.
//
// The liveness connection is opened as the pool opens its own (the pool's
// connection string, BeforeConnect, AfterConnect and PrepareConn), but
// does not count toward its MaxConns: a worker uses, on the database or
// the pooler in front of it, its pool's connections and one more per
// client registered through the journal (and, for a moment while it
// takes a lock again, up to eight more: four tries side by side, two
// connections each). Nothing the application does with the pool keeps
// the journal from holding or retaking its locks. With WithoutLiveness it records nothing and opens
// nothing.
//
// Registering also removes the owners that are gone and hold no lease, so
// that the table holds the live owners and those whose operations are yet
// to be taken, however often processes start.
func (j *Journal) Register(ctx context.Context, owner string) (func() error, error) {
	if owner == "" {
		return nil, fmt.Errorf("%w: Register needs an owner name", idem.ErrInvalidRecord)
	}
	if err := checkOwnerName(owner); err != nil {
		return nil, err
	}
	done, err := j.enterWrite(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	if !j.liveness {
		// A journal that cannot hold a session (behind a pooler in
		// transaction mode, say) records no name: another journal that
		// found one without its lock would take it for dead.
		return func() error { return nil }, nil
	}
	var id int32
	// The owners' writes run at read committed whatever the session's
	// default isolation, as every write of the journal: another worker
	// marks an owner's row when it finds its lock free (as it is between
	// this insert and the lock), and at repeatable read or serializable
	// this registration's own mark would fail with SQLSTATE 40001.
	at := wire.Millis(j.now())
	register := func() error {
		return onLiveSession(ctx, j.pool, func() error {
			return writeTx(ctx, j.pool, func(b *pgx.Batch) {
				b.Queue(j.q.register, owner, at).QueryRow(func(row pgx.Row) error { return row.Scan(&id) })
			})
		})
	}
	err = register()
	if d := asDoubt(err); d != nil {
		err = j.registerAgain(ctx, d, owner, at, register, &id)
	}
	if err != nil {
		if _, ok := isUniqueViolation(err); ok {
			return nil, fmt.Errorf("%w: owner %q registered before; each registration needs a new name", idem.ErrInvalidRecord, owner)
		}
		return nil, j.fail(ctx, "registering owner "+owner, err)
	}
	// The take is given pingEvery, as retake's first try is: the caller's
	// context may have no deadline (idem.New registers with
	// context.Background()), and a new connection that goes silent (a NAT
	// or a firewall that forgot it) would otherwise hold Register until
	// the client's TCP keepalive gives up, minutes on.
	var conn *pgx.Conn
	tctx, tcancel := context.WithTimeout(ctx, j.pingEvery())
	err = onLiveSession(tctx, j.pool, func() (err error) {
		conn, err = j.takeLiveness(tctx, owner, id, onPool(j.pool))
		return err
	})
	timedOut := errors.Is(tctx.Err(), context.DeadlineExceeded)
	tcancel()
	if err != nil && ctx.Err() == nil && (timedOut || brokeSession(err)) {
		// A session broke under the take (the lock's, or the pool's that
		// wrote the owner's new session), or did not answer in time:
		// taken again on new sessions, as the watcher does, a few times,
		// each try bounded (and given longer after one that ran out of
		// time). A lock the broken or silent session took is free once
		// the server has seen the session end: at once when the
		// connection was closed or reset, but only when the server's TCP
		// keepalive gives up on a connection that went silent (two hours
		// and more by default), and Register then fails as before.
		conn, err = j.retake(ctx, owner, id, registerRetakes)
	}
	if err != nil {
		return nil, err // the row, without a lock and without leases, is swept
	}
	// Housekeeping, on another session: the liveness session's transaction
	// would hold the rows it deletes for as long as the owner lives.
	// Should it fail, the next registration sweeps.
	_ = writeTx(ctx, j.pool, func(b *pgx.Batch) { b.Queue(j.q.sweep, int64(j.ownersOID), wire.Millis(j.now())) })
	wctx, stop := context.WithCancel(context.Background())
	r := &registration{owner: owner, id: id, stop: stop, done: make(chan struct{})}
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		stop()
		close(r.done)
		r.conn = conn
		_ = j.end(r)
		return nil, idem.ErrJournalClosed
	}
	j.mine[owner] = r
	j.mu.Unlock()
	go j.watch(wctx, r, conn)
	return func() error { return j.unregister(r) }, nil
}

// registerAgain settles a registration whose insert of the owner's row
// is in doubt and runs it again (register), as the store's claims do:
// behind a transaction pooler, where the first's session cannot be waited
// for (see settle), the insert run again waits for the first's on the
// name's uniqueness, and a row that is what the first sent (this name,
// registered at this time, at) is the registration's own: its number goes
// to id. Another row of the name is another registration's, and the
// unique violation stands.
func (j *Journal) registerAgain(ctx context.Context, d *commitDoubt, owner string, at int64, register func() error, id *int32) error {
	rctx, cancel := readBackCtx(ctx)
	defer cancel()
	if err := settle(rctx, j.pool, d); err != nil {
		return inDoubt(j.where()+": registering owner "+owner, d.err, err)
	}
	err := register()
	if _, ok := isUniqueViolation(err); !ok {
		return err
	}
	var mine int32
	rerr := onLiveSessionRead(ctx, j.pool, func() error {
		return j.pool.QueryRow(ctx, j.q.registered, owner, at).Scan(&mine)
	})
	switch {
	case errors.Is(rerr, pgx.ErrNoRows):
		return err
	case rerr != nil:
		return rerr
	}
	*id = mine
	return nil
}

// maxOwnerName is the longest owner name Register takes, in bytes: well
// within what the owners' unique index can hold whatever the bytes.
const maxOwnerName = 1024

// checkOwnerName refuses an owner name that the owners table or the
// operations' lease_owner column (text) cannot hold.
func checkOwnerName(owner string) error {
	var why string
	switch {
	case strings.IndexByte(owner, 0) >= 0:
		why = "holds a NUL byte, which PostgreSQL's text cannot"
	case !utf8.ValidString(owner):
		why = "is not valid UTF-8, which PostgreSQL's text needs"
	case len(owner) > maxOwnerName:
		why = fmt.Sprintf("is %d bytes long, over the %d the journal takes", len(owner), maxOwnerName)
	default:
		return nil
	}
	return fmt.Errorf("%w: owner name %.64q %s; name the worker in UTF-8 text without NUL, at most %d bytes",
		idem.ErrInvalidRecord, owner, why, maxOwnerName)
}

// ErrPoolTooSmall was returned by Register when a registration's
// liveness session would have taken the pool's last connection.
//
// Deprecated: a registration no longer takes a connection of the pool
// (its liveness session is a connection of its own, see Register), so no
// registration is refused for the pool's size and nothing returns this
// error any longer. It is kept so that code that tests for it still
// compiles.
var ErrPoolTooSmall = errors.New("the pool cannot spare a connection for the liveness session")

// takeLiveness takes owner's liveness lock on a new connection of its own
// (see dial) and says so in the owner's row, through w: a new session of
// the owner.
//
// The connection is not the pool's: the application, whose queries may
// hold every connection of the pool and have more waiting, would then
// decide how soon a live worker holds its lock again, and a connection
// that idled in the pool may have gone silent with the one that held the
// lock (a NAT or a firewall that forgets them all at once).
//
// The lock is a transaction's (pg_try_advisory_xact_lock), taken in a
// transaction that stays open until the owner unregisters, not a
// session's: a transaction pooler (PgBouncer's pool_mode=transaction)
// binds a server session to its client for a transaction only. A session
// lock would stay on whichever server session the statement ran on, which
// the pooler gives other clients and closes when it likes while the
// worker's own connection to the pooler lives on: the lock then vanishes
// unseen, and the worker is taken for dead while it lives, or it outlives
// the worker, kept by the pooler, and a dead worker is kept alive. An open
// transaction keeps its server session bound to this connection, directly
// or through any pooler: when either ends, both do, and the lock with
// them. The transaction writes nothing and holds no snapshot once its
// statement ends (read committed, set for it whatever the session's
// default), so it holds back neither VACUUM nor
// any other session; only idle_in_transaction_session_timeout and
// transaction_timeout (PostgreSQL 17) would end it, which the transaction
// turns off for itself. statement_timeout and lock_timeout touch it not:
// its statement takes the lock without waiting, and it then runs only
// empty statements.
func (j *Journal) takeLiveness(ctx context.Context, owner string, id int32, w batcher) (*pgx.Conn, error) {
	conn, err := j.dial(ctx)
	if err != nil {
		return nil, j.fail(ctx, "owner "+owner+"'s liveness session", err)
	}
	var locked bool
	_, err = conn.Exec(ctx, beginTx)
	if err == nil && conn.PgConn().ParameterStatus("client_encoding") != "UTF8" {
		// pgx runs the simple protocol only in UTF8, and a role or a
		// database may default to another client_encoding: UTF8 for this
		// transaction only.
		_, err = conn.Exec(ctx, `SELECT set_config('client_encoding', 'UTF8', true)`)
	}
	if err == nil {
		// In the simple protocol: the extended protocol's unnamed portal
		// outlives its statement until the next statement or the end of
		// the transaction, and with it the snapshot it ran on, so the
		// open transaction would hold back VACUUM (backend_xmin) for the
		// worker's life.
		//
		// The transaction turns off, for itself, the timeouts that would
		// end it: idle_in_transaction_session_timeout, and from
		// PostgreSQL 17 on transaction_timeout, which an older server does
		// not know (set_config would fail there: CASE runs it only on 17
		// and later).
		err = conn.QueryRow(ctx, `SELECT set_config('idle_in_transaction_session_timeout', '0', true) IS NOT NULL
			AND CASE WHEN current_setting('server_version_num')::int >= 170000
				THEN set_config('transaction_timeout', '0', true) IS NOT NULL ELSE true END
			AND pg_try_advisory_xact_lock($1, $2)`, pgx.QueryExecModeSimpleProtocol, j.livenessClass(), id).Scan(&locked)
	}
	if err != nil {
		closeConn(conn) // the lock may have been taken, and the answer lost
		return nil, j.fail(ctx, "owner "+owner+"'s liveness lock", err)
	}
	if !locked {
		// Only this registration takes this lock: another session holds it
		// when something else uses advisory locks with the same two keys,
		// or when a session of this owner's lives on, its end not yet seen
		// by the database.
		closeConn(conn)
		return nil, fmt.Errorf("postgres journal in schema %q: owner %q's liveness lock (advisory lock %d, %d) is held by another session",
			j.schema, owner, j.livenessClass(), id)
	}
	// On another session: written in the lock's transaction, the row
	// would be seen only once the owner unregisters. (idle_session_timeout
	// ends no session in a transaction.)
	// At read committed whatever the session's default isolation (see
	// Register).
	b := &pgx.Batch{}
	b.Queue(beginTx)
	b.Queue(j.q.newSession, id, owner, wire.Millis(j.now()))
	b.Queue("COMMIT")
	if err := w(ctx, b); err != nil {
		closeConn(conn) // ending the session lets go of the lock
		return nil, j.fail(ctx, "owner "+owner+"'s liveness session", err)
	}
	return conn, nil
}

// batcher sends a transaction as one batch, on a pool or a connection.
type batcher func(ctx context.Context, b *pgx.Batch) error

// onPool is a batcher on the pool.
func onPool(pool *pgxpool.Pool) batcher {
	return func(ctx context.Context, b *pgx.Batch) error { return pool.SendBatch(ctx, b).Close() }
}

// dial opens a connection outside the pool, as the pool opens its own:
// the same connection string, and the pool's BeforeConnect, AfterConnect
// and PrepareConn (which the pool would run before handing the connection
// out), so that a hook that supplies a password, a role or a setting does
// so here too.
func (j *Journal) dial(ctx context.Context) (*pgx.Conn, error) {
	pc := j.pool.Config() // a copy, ConnConfig included
	if pc.ConnConfig.ConnectTimeout <= 0 {
		// As the pool does: a context without a deadline (Register's
		// caller's) does not wait on an unreachable server for ever.
		pc.ConnConfig.ConnectTimeout = 2 * time.Minute
	}
	if pc.BeforeConnect != nil {
		if err := pc.BeforeConnect(ctx, pc.ConnConfig); err != nil {
			return nil, err
		}
	}
	conn, err := pgx.ConnectConfig(ctx, pc.ConnConfig)
	if err != nil {
		return nil, err
	}
	if pc.AfterConnect != nil {
		if err := pc.AfterConnect(ctx, conn); err != nil {
			closeConn(conn)
			return nil, err
		}
	}
	if pc.PrepareConn != nil {
		ok, err := pc.PrepareConn(ctx, conn)
		if err == nil && !ok {
			err = errors.New("the pool's PrepareConn refused the connection")
		}
		if err != nil {
			closeConn(conn)
			return nil, err
		}
	}
	return conn, nil
}

// closeConn ends a connection's session, without waiting long on a
// connection that has gone silent: pgx's Close sends the server its
// Terminate (bounded by a second, should the socket not take it), and the
// socket is closed then whatever pgx does. A connection whose statement
// was cut short (its context ended, or its read failed) is one pgx has
// already begun to close in the background, reading what the server still
// sends for up to 15 s: closing its socket ends that reading at once.
func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
	_ = c.PgConn().Conn().Close()
}

// How soon the watcher tries again to take a lock it could not.
const (
	retakeFirst = 50 * time.Millisecond
	retakeMax   = 500 * time.Millisecond
)

// retakeOverlap is how many of retake's tries may be under way at once.
const retakeOverlap = 4

// retakeLimit is the longest time retake gives a try.
const retakeLimit = 10 * time.Second

// registerRetakes is how many times Register takes its lock again on new
// sessions after a session broke under its first take, or did not answer
// in time: enough for a lost answer or two, bounded so that a
// registration whose sessions keep breaking, or keep going unanswered at
// retake's longest bound, fails (in well under a minute: 23 s measured on
// a database that answered nothing, default grace) rather than spin.
const registerRetakes = 5

// brokeSession reports whether err is that of a session that broke (or
// ended) under a statement, or of a commit in doubt: something another
// session may not meet. A connection that could not be opened is not one
// (see endedForRead).
func brokeSession(err error) bool {
	return endedForRead(err) || asDoubt(err) != nil
}

// watch waits on the owner's liveness session until unregister stops it;
// should the session end (whatever ended it) while the owner lives on, it
// takes the lock again on a new session, trying until it can. Meanwhile
// the owner keeps driving what it holds under its leases, and other
// journals take them only if it stays without a session for their
// LivenessGrace.
func (j *Journal) watch(ctx context.Context, r *registration, conn *pgx.Conn) {
	defer close(r.done)
	every := j.pingEvery()
	for conn != nil {
		// Nothing listens on this session: the wait returns when the
		// session ends (or the watcher is stopped), or once it has idled
		// for every, when the server is asked whether it is still there.
		wctx, cancel := context.WithTimeout(ctx, every)
		err := conn.PgConn().WaitForNotification(wctx)
		idle := wctx.Err() != nil
		cancel()
		switch {
		case ctx.Err() != nil:
			// Stopped: end leaves the registration on this session, the
			// row and the lock in one commit, if it lives (a wait cut
			// short says nothing of the session).
			if err != nil && !idle {
				closeConn(conn)
				conn = nil
			}
		case err != nil && !idle:
			closeConn(conn)
			conn, _ = j.retake(ctx, r.owner, r.id, 0)
		case idle:
			conn = j.check(ctx, r, conn, every)
		}
		if ctx.Err() != nil {
			r.conn = conn
			return
		}
	}
}

// check pings conn, which has idled for every, and returns the session
// that holds the lock now: conn if it answers within every, a new one if
// it failed. Make before break: a session that does not answer may be
// stalled rather than gone (a network blip that holds its packets), and
// the server may still hold its lock, so it is not closed (which would
// let go of the lock at once) until a new session holds the lock; the lock
// is taken on new sessions meanwhile (their tries find it held while the
// old session lives, and take it once the server has ended it), and
// whichever answers first is kept: the old session, should its ping be
// answered, or the new one. Stopped (ctx), it returns the old session if
// its ping was answered within every, else nil (a new session taken then
// is returned rather than closed), for end.
func (j *Journal) check(ctx context.Context, r *registration, conn *pgx.Conn, every time.Duration) *pgx.Conn {
	p := startPing(conn)
	t := time.NewTimer(every)
	select {
	case <-p.done:
		t.Stop()
		if p.err == nil {
			return conn
		}
		closeConn(conn)
		conn, _ = j.retake(ctx, r.owner, r.id, 0)
		return conn
	case <-t.C:
	}
	// Stopping the watcher does not cut a ping short before every: end
	// would have no session to end the registration on, and falls back
	// to the pool, slower where the pool has no connection to give
	// (behind a PgBouncer that PAUSE holds, say).
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	taken := make(chan *pgx.Conn, 1)
	go func() {
		c, _ := j.retake(rctx, r.owner, r.id, 0)
		taken <- c
	}()
	pinged := p.done
	for {
		select {
		case <-pinged:
			pinged = nil
			if p.err == nil {
				// The old session answered: it lives, and holds the
				// lock, which the tries under way find held. Should one
				// have taken it all the same (the old session's lock
				// was lost meanwhile), the new session is the one
				// that holds it.
				cancel()
				if c := <-taken; c != nil {
					closeConn(conn)
					return c
				}
				return conn
			}
			closeConn(conn)
		case c := <-taken:
			// A new session holds the lock, so the old one's has ended
			// on the server (or the watcher was stopped: c is nil).
			if pinged != nil {
				p.stop()
				closeConn(conn)
			}
			return c
		}
	}
}

// pinging is a ping of the liveness session in flight: an empty statement,
// which takes no snapshot; an answer says the session and its lock live.
// It is not given a deadline, which would close the connection when it
// passed (pgx closes a connection whose statement is canceled), and with
// it a session that may be stalled, not gone: the watcher waits for it
// as long as it likes, and stop closes the connection.
//
// It is sent and read through pgconn's own messages rather than Exec: a
// statement of Exec's whose read fails (its context canceled, or its
// socket closed) has pgx close the connection in the background, with a
// cancel request on a new connection and up to 15 s of reading what the
// server still sends, which a silent connection never ends. Its reads
// (ReceiveMessage) leave the connection to its owner: stop closes its
// socket at once, and closeConn then closes it without waiting.
type pinging struct {
	done chan struct{} // closed once answered, or failed
	err  error
	conn *pgx.Conn
}

func startPing(conn *pgx.Conn) *pinging {
	p := &pinging{done: make(chan struct{}), conn: conn}
	go func() {
		defer close(p.done)
		p.err = ping(conn.PgConn())
	}()
	return p
}

// ping sends an empty statement on c and reads its answer, until the
// server is ready for the next (an error it sends is the ping's error),
// or the connection fails.
func ping(c *pgconn.PgConn) error {
	c.Frontend().Send(&pgproto3.Query{String: ""})
	if err := c.Frontend().Flush(); err != nil {
		return err
	}
	var failed error
	for {
		msg, err := c.ReceiveMessage(context.Background())
		if err != nil {
			return err
		}
		switch msg := msg.(type) {
		case *pgproto3.ErrorResponse:
			failed = pgconn.ErrorResponseToPgError(msg)
		case *pgproto3.ReadyForQuery:
			return failed
		}
	}
}

// stop cuts the ping short, closing its connection's socket, and waits
// for it.
func (p *pinging) stop() {
	_ = p.conn.PgConn().Conn().Close()
	<-p.done
}

// pingEvery is how long the liveness session idles before the watcher
// asks the server whether it is still there, and how long it waits for
// the answer before it takes the lock on a new session meanwhile: a
// quarter of the grace, so that a session the server ended unheard (its
// TCP keepalive gave up on a connection that a NAT or a firewall forgot,
// and drops silently) is taken again on a new one well within it. The
// client's own TCP keepalive would take minutes. The traffic also keeps
// such a connection from being forgotten.
func (j *Journal) pingEvery() time.Duration {
	return min(max(j.grace/4, 100*time.Millisecond), 5*time.Second)
}

// retake takes owner's lock on a new session, trying until it can or ctx
// ends, or (tries > 0) at most tries times, returning the last try's
// error. A try that ran out of a time shorter than the longest a try is
// given (retakeLimit) does not count among tries: it is given again,
// longer, so that a slow server, machine or network (a take is a few
// round trips) does not spend them all.
//
// Each try opens two connections of its own, side by side: one for the
// lock, and one for the owner's row, which the pool's connections could
// not be trusted with (see takeLiveness), closed once written. A try is
// given pingEvery at first, so that a connection that does not answer (to
// a server that has gone, or through a middlebox that drops it) is given
// up well within the grace, and twice as long at each try that runs out
// of time, up to retakeLimit, so that a slow server or machine is not
// given up on for ever.
//
// Tries overlap: one that has not answered within a quarter of its time
// has another started beside it, up to retakeOverlap at once, and the
// first that takes the lock wins (the others find it held). Behind a
// pooler, a new connection's statements run on the pooler's idle server
// sessions, which may have gone silent with the one that held the lock
// (a NAT or a firewall that forgot them all): each try in flight holds
// one of them, so that a later try meets a live one within the grace
// rather than after every silent one has timed out in turn.
func (j *Journal) retake(ctx context.Context, owner string, id int32, tries int) (*pgx.Conn, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		conn     *pgx.Conn
		err      error
		timedOut bool
		limit    time.Duration // the try's time
	}
	results := make(chan result, retakeOverlap)
	inFlight, started := 0, 0
	defer func() {
		// Tries still under way end with ctx; a lock one took anyway is
		// let go.
		go func(n int) {
			for ; n > 0; n-- {
				if r := <-results; r.conn != nil {
					closeConn(r.conn)
				}
			}
		}(inFlight)
	}()
	wait := retakeFirst
	limit := j.pingEvery()
	var last error
	next := time.NewTimer(0) // when to start the next try
	defer next.Stop()
	for {
		select {
		case <-next.C:
			if inFlight < retakeOverlap && (tries <= 0 || started < tries) {
				inFlight++
				started++
				go func(limit time.Duration) {
					tctx, tcancel := context.WithTimeout(ctx, limit)
					defer tcancel()
					conn, err := j.retakeOnce(tctx, owner, id)
					results <- result{conn, err, errors.Is(tctx.Err(), context.DeadlineExceeded), limit}
				}(limit)
				next.Reset(limit / 4) // unanswered by then: another beside it
			}
		case r := <-results:
			inFlight--
			if r.err == nil {
				return r.conn, nil
			}
			last = r.err
			if r.timedOut {
				limit = min(2*limit, retakeLimit)
				if r.limit < retakeLimit {
					started-- // given again, longer: not one of tries
				}
			}
			if tries > 0 && started >= tries {
				if inFlight == 0 {
					return nil, last
				}
				continue
			}
			next.Reset(wait)
			wait = min(2*wait, retakeMax)
		case <-ctx.Done():
			if last == nil {
				last = ctx.Err()
			}
			return nil, j.fail(ctx, "owner "+owner+"'s liveness lock", last)
		}
	}
}

// retakeOnce is one try of retake. The row's connection is opened while
// the lock's is, so that a try costs one connection's opening, not two.
func (j *Journal) retakeOnce(ctx context.Context, owner string, id int32) (*pgx.Conn, error) {
	w := &dialing{done: make(chan struct{})}
	go func() {
		defer close(w.done)
		w.conn, w.err = j.dial(ctx)
	}()
	defer w.close()
	return j.takeLiveness(ctx, owner, id, w.send)
}

// dialing is a connection being opened: Exec waits for it.
type dialing struct {
	done chan struct{}
	conn *pgx.Conn
	err  error
}

// send is a batcher on the connection, once it is open.
func (d *dialing) send(ctx context.Context, b *pgx.Batch) error {
	select {
	case <-d.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if d.err != nil {
		return d.err
	}
	return d.conn.SendBatch(ctx, b).Close()
}

// close waits for the connection's opening, bound by its context, and
// closes it.
func (d *dialing) close() {
	<-d.done
	if d.conn != nil {
		closeConn(d.conn)
	}
}

// unregister ends r and then takes it out of the journal. It returns nil
// only once the registration has ended: a call made while another ends it
// waits for that one (end), and after one that failed the registration
// stays in the journal (Close ends it too), and the next call tries again.
func (j *Journal) unregister(r *registration) error {
	if err := j.end(r); err != nil {
		return err
	}
	j.mu.Lock()
	if j.mine[r.owner] == r {
		delete(j.mine, r.owner)
	}
	j.mu.Unlock()
	return nil
}

// endTimeout bounds each of end's two ways of ending a registration: on
// its liveness session, and through the pool.
const endTimeout = 10 * time.Second

// end stops r's watcher and ends the registration: the owner's row says
// it ended, and the lock is let go with the same commit, so that other
// journals see the owner gone at once.
func (j *Journal) end(r *registration) error {
	r.ending.Lock()
	defer r.ending.Unlock()
	if r.ended {
		return nil
	}
	err := j.endOnce(r)
	r.ended = err == nil
	return err
}

// endOnce is one try of end: after the first, the watcher has stopped and
// r.conn is nil, and the end runs through the pool.
func (j *Journal) endOnce(r *registration) error {
	r.stop()
	<-r.done
	if r.conn == nil {
		// No session now: the row alone says the owner ended.
		return j.endThroughPool(context.Background(), r)
	}
	defer func() { r.conn = nil }() // closed: a later try goes through the pool
	// A session that has not ended it within pingEvery (how long the
	// watcher gives a ping) may be slow, or silent: the row is ended
	// through the pool meanwhile, the session left to answer, and the
	// first end that commits counts. The session is not cut short while
	// it may still answer (a COMMIT cut short would be in doubt): should
	// its UPDATE have run, the pool's waits for its transaction to end.
	ctx, cancel := context.WithTimeout(context.Background(), endTimeout)
	defer cancel()
	onSession := make(chan error, 1)
	go func() { onSession <- j.endOnSession(ctx, r) }()
	t := time.NewTimer(j.pingEvery())
	defer t.Stop()
	var err error
	select {
	case err = <-onSession:
		if err == nil {
			return nil
		}
	case <-t.C:
		pctx, pcancel := context.WithCancel(context.Background())
		defer pcancel()
		throughPool := make(chan error, 1)
		go func() { throughPool <- j.endThroughPool(pctx, r) }()
		select {
		case err = <-onSession:
			if err == nil {
				pcancel() // ended on the session: the pool's end is not needed
			}
			perr := <-throughPool
			if err == nil || perr == nil {
				return nil
			}
			return fmt.Errorf("%w (on its liveness session: %v)", perr, err)
		case perr := <-throughPool:
			cancel() // ended: the session, if it still lives, lets go of the lock
			serr := <-onSession
			if perr == nil || serr == nil {
				return nil
			}
			return fmt.Errorf("%w (on its liveness session: %v)", perr, serr)
		}
	}
	if d := asDoubt(err); d != nil {
		// The COMMIT went out and its answer was lost: once its session
		// has no transaction open (settle), the row says whether it
		// committed, and the end through the pool, which keeps an end
		// already made (endOwner), reads it back or makes it.
		rctx, rcancel := readBackCtx(context.Background())
		defer rcancel()
		if serr := settle(rctx, j.pool, d); serr != nil {
			return inDoubt(j.where()+": ending owner "+r.owner, d.err, serr)
		}
	}
	// The session failed (broke, or its transaction had aborted): its
	// transaction, closed with it, ends nothing; the row is ended through
	// the pool, as when the watcher held no session.
	if perr := j.endThroughPool(context.Background(), r); perr != nil {
		return fmt.Errorf("%w (on its liveness session: %v)", perr, err)
	}
	return nil
}

// endOnSession ends the registration on its liveness session, r.conn, and
// closes it: the row's ended_at and the lock's release in one commit. An
// error whose COMMIT went out unanswered is a commitDoubt. (r.conn is left
// for endOnce to clear once this returns.)
func (j *Journal) endOnSession(ctx context.Context, r *registration) error {
	conn := r.conn
	defer closeConn(conn) // the connection is the registration's own
	if _, err := conn.Exec(ctx, j.q.endOwner, r.id, r.owner); err != nil {
		return err
	}
	tag, err := conn.Exec(ctx, `COMMIT`)
	if err != nil {
		return doubtful(conn, err)
	}
	if tag.String() != "COMMIT" {
		return fmt.Errorf("postgres journal in schema %q: ending owner %q: the liveness transaction ended with %s", j.schema, r.owner, tag)
	}
	return nil
}

// endThroughPool ends the registration with a transaction of the pool:
// the row alone says the owner ended (its lock, if a session of its still
// holds it, goes with that session). A commit in doubt is settled and the
// end run again, which keeps the first's if it committed.
func (j *Journal) endThroughPool(ctx context.Context, r *registration) error {
	ctx, cancel := context.WithTimeout(ctx, endTimeout)
	defer cancel()
	write := func() error {
		return onLiveSession(ctx, j.pool, func() error {
			return writeTx(ctx, j.pool, func(b *pgx.Batch) { b.Queue(j.q.endOwner, r.id, r.owner) })
		})
	}
	err := write()
	if d := asDoubt(err); d != nil {
		rctx, rcancel := context.WithTimeout(ctx, readBackTimeout)
		defer rcancel()
		if serr := settle(rctx, j.pool, d); serr != nil {
			return inDoubt(j.where()+": ending owner "+r.owner, d.err, serr)
		}
		err = write()
		if d := asDoubt(err); d != nil {
			return inDoubt(j.where()+": ending owner "+r.owner, d.err, err)
		}
	}
	return err
}

// registered reports whether owner is registered through this journal,
// and so alive, whether or not it holds a session now.
func (j *Journal) registered(owner string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.mine[owner] != nil
}

// querier is a pool, a transaction or a connection.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// errServerUpPrivilege reports a judgement of owners that found the table
// server_up empty (after a crash recovery, or on a promoted standby) and
// could not fill it: the journal's role lacks INSERT on it. The judgement
// itself stands, counting from now, so that no owner is found gone by its
// absence until a role that may insert into server_up has judged: a killed
// worker's operations are then taken when their leases lapse. Claim and
// Acquire degrade so rather than fail (see the package doc's Tables).
var errServerUpPrivilege = errors.New("the journal's role may not insert into server_up")

// mayMarkServerUp refuses, at OpenJournal, a journal that would judge
// owners (liveness, not ReadOnly) for a role that may not both read
// server_up (every judgement does) and insert into it: without SELECT
// every judgement fails, so a Claim while another worker holds a lease
// fails; without INSERT they degrade as errServerUpPrivilege says, with
// nothing to tell the operator that a fleet's take-over had slowed from
// LivenessGrace to the leases' length. The privileges asked are those of
// the columns the judgement reads and the insert writes, which a grant on
// the table gives as well as one on those columns.
func mayMarkServerUp(ctx context.Context, q reader, schema string) error {
	var may bool
	var role string
	if err := q.QueryRow(ctx, `SELECT bool_and(has_column_privilege($1::regclass, c, p)), current_user
		FROM unnest(ARRAY['id', 'at']) c, unnest(ARRAY['SELECT', 'INSERT']) p`, pgschema.Ident(schema)+".server_up").Scan(&may, &role); err != nil || may {
		return err
	}
	return fmt.Errorf("postgres journal in schema %q: %w: without them, its claims fail while another worker holds a lease, or, "+
		"after a crash recovery or a promotion of the database, a dead worker's operations are taken only when their leases lapse, not after LivenessGrace; "+
		"run GRANT SELECT, INSERT ON %s.server_up TO %s (see the package doc's Privileges), or open the journal WithoutLiveness, ReadOnly if it only reads",
		schema, errServerUpSelectInsert, pgschema.Ident(schema), pgschema.Ident(role))
}

// errServerUpSelectInsert is OpenJournal's refusal of a role that may not
// read and insert into server_up (mayMarkServerUp).
var errServerUpSelectInsert = errors.New("the journal's role may not select from and insert into server_up")

// judge returns the owners among names that are gone, marking those whose
// lock it finds free (see the top of this file). q may be a write
// transaction's connection: the judgement runs on it, never asking the
// pool for another while that transaction holds one (on a small pool
// there may be none). An error of errServerUpPrivilege comes with the
// judgement's answer.
func (j *Journal) judge(ctx context.Context, q querier, names []string, inTx bool) ([]string, error) {
	rows, err := q.Query(ctx, j.q.judge, int64(j.ownersOID), names, j.grace.Milliseconds())
	if err != nil {
		return nil, err
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[*string])
	if err != nil {
		return nil, err
	}
	var gone []string
	empty := false
	for _, n := range found {
		if n == nil {
			empty = true
			continue
		}
		gone = append(gone, *n)
	}
	if !empty {
		return gone, nil
	}
	// server_up is empty: filled, in a transaction in a subtransaction,
	// whose failure leaves the transaction as it was.
	if inTx {
		if _, err := q.Exec(ctx, `SAVEPOINT idem_server_up`); err != nil {
			return nil, err
		}
	}
	if _, err := q.Exec(ctx, j.q.insertUp); err != nil {
		if inTx {
			if _, rerr := q.Exec(ctx, `ROLLBACK TO SAVEPOINT idem_server_up`); rerr != nil {
				return nil, rerr
			}
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" {
			return gone, fmt.Errorf("postgres journal in schema %q: %w: %w; run GRANT SELECT, INSERT ON %s.server_up TO the workers' role",
				j.schema, errServerUpPrivilege, err, pgschema.Ident(j.schema))
		}
		return nil, err
	}
	if inTx {
		_, err = q.Exec(ctx, `RELEASE SAVEPOINT idem_server_up`)
	}
	return gone, err
}

// goneOn returns the judgement of one owner for the rules (ApplyUpdate,
// ApplyClaim), run on conn, which may be in the write's transaction: in a
// subtransaction there, so that a judgement that fails leaves the write as
// it was. An owner this journal does not know of (never registered with
// liveness, or swept) is not known to be gone: its leases lapse; nor is
// one whose judgement fails.
func (j *Journal) goneOn(ctx context.Context, conn *pgxpool.Conn, inTx bool) func(string) bool {
	return func(owner string) bool {
		if !j.liveness || owner == "" || j.registered(owner) {
			return false
		}
		if !inTx {
			gone, err := j.judge(ctx, conn, []string{owner}, false)
			return (err == nil || errors.Is(err, errServerUpPrivilege)) && len(gone) == 1
		}
		if _, err := conn.Exec(ctx, `SAVEPOINT idem_judge`); err != nil {
			return false
		}
		gone, err := j.judge(ctx, conn, []string{owner}, true)
		if err != nil && !errors.Is(err, errServerUpPrivilege) {
			_, _ = conn.Exec(ctx, `ROLLBACK TO SAVEPOINT idem_judge`)
			return false
		}
		_, _ = conn.Exec(ctx, `RELEASE SAVEPOINT idem_judge`)
		return len(gone) == 1
	}
}

// goneOwners returns the owners of live leases on due records whose owner
// is gone, for Claim's query.
func (j *Journal) goneOwners(ctx context.Context, tx pgx.Tx, due, now time.Time) ([]string, error) {
	if !j.liveness {
		return nil, nil
	}
	rows, err := tx.Query(ctx, j.q.goneOwners, wire.Millis(due), wire.Millis(now))
	if err != nil {
		return nil, err
	}
	owners, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	owners = slices.DeleteFunc(owners, j.registered)
	if len(owners) == 0 {
		return nil, nil
	}
	gone, err := j.judge(ctx, tx, owners, true)
	if errors.Is(err, errServerUpPrivilege) {
		return gone, nil // the judgement stands: see errServerUpPrivilege
	}
	return gone, err
}
