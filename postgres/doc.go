// Package postgres keeps idem's journal and the server middleware's keys
// in PostgreSQL, for fleets that outgrow one machine: the workers of a
// fleet share one journal and take over each other's operations, and the
// replicas of an API share one store of keys.
//
// It is a module of its own, so that an application on the embedded SQLite
// journal never downloads a PostgreSQL driver. It is built on
// github.com/jackc/pgx/v5: the application opens a *pgxpool.Pool and
// passes it in.
//
// # The journal
//
// Journal is an idem.Journal that every worker of a fleet opens on its own
// pool: operations begun by one worker may be finished by any, and Resume
// takes up the operations of workers that died.
//
//	pool, err := pgxpool.New(ctx, dsn)               // each worker's own pool
//	journal, err := postgres.OpenJournal(ctx, pool)  // schema "idem", migrated on open
//	client, err := idem.New(idem.Config{Journal: journal, Owner: "worker-1", ...})
//	report, err := client.Resume(ctx)                // its own work and that of dead workers
//
// It passes journaltest, the suite the SQLite journal passes, with the
// same records, the same rules (package journal) and the same errors.
//
// Tables. In the schema that Schema names: operations, one row per
// operation with its request, key, state, lease and response; due, the
// active operations by when they are due; events, its history (but the
// event of an operation's current version and, for an operation its
// first write created without a read, its creation event, which its row
// holds); owners,
// the workers ever registered; server_up (unlogged), when the server was
// last found up, from which a liveness grace counts (see Liveness); sync,
// one row that Sync commits; and idem_schema, the version of each kind of
// idem's tables, with their sequences. OpenJournal
// migrates them; MigrateJournal does it alone, for teams that migrate
// apart, and WithoutMigration then refuses tables that are missing or
// older (ErrNotMigrated). Another program's operations table is refused
// (idem.ErrNotJournal), and so is a newer journal (idem.ErrSchemaTooNew),
// changing nothing. ReadOnly opens a journal to read it only (idem ls):
// each read in a transaction begun READ ONLY, every write refused.
//
// Privileges. A workers' role that does not own the tables (migrated apart,
// opened WithoutMigration) needs, in the schema "idem":
//
//	GRANT USAGE ON SCHEMA idem TO workers;
//	GRANT SELECT, INSERT, UPDATE, DELETE ON idem.operations, idem.due, idem.events, idem.owners, idem.sync TO workers;
//	GRANT SELECT, INSERT ON idem.server_up TO workers;
//	GRANT SELECT ON idem.idem_schema TO workers;
//	GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA idem TO workers;
//
// and a ReadOnly journal (idem ls, idem ui) SELECT on the tables alone.
// OpenJournal refuses a journal with liveness for a role without SELECT and
// INSERT on server_up (on the table, or on its columns), naming the grant. A role that loses it once its journal is
// open still claims and acquires while the table holds its row; when the
// table is empty (after a crash recovery, or on a promoted standby) and no
// role that may insert into it has judged a worker since, a killed
// worker's operations are taken when their leases lapse rather than after
// the grace: the judgement then counts from now, as it must not count the
// server's downtime as the worker's absence.
//
// Claims. Claim selects due operations FOR UPDATE SKIP LOCKED: workers
// claiming at once take different operations and never wait for each
// other. Every lease carries its owner and an epoch that each claim
// increments; every renewal and every write of a leased operation is
// fenced on both, so a worker that lost its lease has its late writes
// refused (idem.ErrLeaseLost) and stops driving the operation.
//
// Liveness. Register holds an advisory lock for the owner on a connection
// of its own, opened as the pool opens its connections (the pool's
// connection string and its BeforeConnect, AfterConnect and PrepareConn
// hooks) but outside the pool, in a transaction left open for as long as
// the owner is registered: PostgreSQL releases the lock when the session
// ends, however the worker ended (exit, crash, SIGKILL, a network
// partition). The application's use of the pool never delays the lock,
// and a worker uses one connection per registered client beyond its
// pool's MaxConns (and, for a moment while it takes a lock again, up to
// eight more: up to four tries side by side, of two connections each):
// count them in the server's max_connections. The open
// transaction keeps the server session bound to the worker's connection
// behind a transaction pooler too (PgBouncer's pool_mode=transaction): the
// pooler closes the one when the other ends, and holds one server session
// per registered worker. It holds no snapshot between statements, so it
// holds back no VACUUM, and it turns idle_in_transaction_session_timeout
// off for itself. A session may also end while its worker lives on (an
// administrator's pg_terminate_backend, a restart of the database, a
// pooler closing the connection): the journal watches the session and
// takes the lock again at once on a new connection it opens for the
// purpose (never one that idled in the pool, which may have gone silent
// with it), starting another try beside one that has not answered
// within a sixteenth of the grace (up to four at once: behind a pooler,
// each holds one of the pooler's server sessions, which may have gone
// silent together) and giving a try up after a quarter of it; it asks the
// server on the idle session every quarter of its LivenessGrace, so that
// a session ended unheard (a NAT or firewall that drops the connection
// silently) is taken again too. A session that does not answer is not let
// go before a new one holds the lock (a stalled session's server side
// still holds it, and the new session's tries find it held): the first
// to answer is kept. Register, too, gives its take a quarter of the grace
// whatever its context (idem.New registers with context.Background()),
// and takes its lock again on new sessions, as the watcher does, when a
// session breaks under it (a lost answer) or does not answer in time. So a free lock makes its
// owner gone only once it has stayed free for LivenessGrace (2 s by
// default, on the database's clock); Claim and
// Acquire then take its leases, before they lapse. Every judgement is made
// afresh: an owner found gone once and holding its lock again is alive.
// The grace counts no time the database was down: it counts from when the
// journal found the server up again at the earliest, after a restart or a
// crash (one backend's included, after which PostgreSQL reinitialises
// without a restart), given the privileges that Privileges names.
// Owners lists the workers and whether each is alive; on a hot standby,
// whose locks are not the primary's, it cannot tell and says so
// (ErrLivenessUnknown): run it against the primary.
// While a worker has no liveness session it keeps driving what it holds
// under its leases, fenced by their epochs, and nobody takes those before
// the leases lapse unless the worker stays without a session for the
// grace, when it is taken for dead and its late writes are refused
// (idem.ErrLeaseLost). An owner that unregisters (Client.Close,
// Journal.Close) is gone at once: the end is made on its liveness session,
// the row and the lock in one commit, or through the pool should that
// session fail or not have ended it within a quarter of the grace (a
// commit whose answer was lost is read back). Unregistering returns nil
// only once the end is made; a call made during another waits for it, and
// one made after another failed tries again. Registering removes the owners that are
// gone and hold no lease, so the owners table does not grow with every
// process start. The lease's lapse remains the fallback, and the only rule
// with WithoutLiveness, which records nothing: a fleet may mix journals
// with and without liveness.
//
// Time. Leases are judged on the database server's clock, never a
// worker's: see Time below.
//
// Durability and group commit: see Journal. An intent is committed with
// synchronous_commit on before anything is sent; an outcome the server can
// tell again may be committed with it off; writes from many goroutines
// share one transaction and one commit. The journal sets the level of each
// of its transactions itself: a database or a role whose default is off
// (ALTER DATABASE / ALTER ROLE ... SET synchronous_commit = off, a common
// tuning) changes nothing, and a stronger level its sessions run at, such
// as remote_apply, is kept.
//
// Lost acknowledgements. When a commit reaches the server and its answer
// does not come back (the connection breaks after the COMMIT went out),
// the write may or may not be committed. The journal and the store do not
// guess: they wait until the session that ran it has no transaction open
// (ending it if it sits idle in one, its COMMIT lost on the way), then
// read the write back by key and version (the journal's events, or the
// one the operation's row holds; the store's entry, its fingerprint,
// time and token), and answer as the commit would have. A write found
// not committed runs again: the journal's once, the store's completion up
// to twice more (behind a transaction pooler the read-back cannot wait for
// the session that ran it, and the first may still commit). A Renew or Sync, which change nothing
// when run twice, simply runs again, and so do the store's Renew and
// Release (a release run again that finds no entry at all is done).
// What remains is a database out of reach for the read-back too: the
// error then matches ErrCommitInDoubt and names the write (the operation,
// its key, the version), and says that it may or may not be committed.
// An intent in that state is journaled, or not, under its client's own
// lease; the client's next Do of the operation takes it up at once (no
// call of the client holds it), and asks the server before it sends
// again, as for any in_flight operation. Other workers wait for the lease
// to lapse, or for the client to be gone.
//
// An error a pooler sends for a server connection it lost (PgBouncer's
// "server conn crashed?", SQLSTATE 08P01), and any connection exception
// or FATAL but the two the server sends before it reads a statement
// (57P05, 25P03), proves nothing about the commit: it is read back as a
// lost acknowledgement is. A write whose connection broke before its
// commit went out did not commit; but its server session may not know
// (a network that lost its state carries neither the close nor pgx's
// cancel request), and would keep its rows locked for hours, idle in its
// transaction: the journal ends that session in the background, found by
// its server process and client port (or, without a pooler, by its
// process, start and last statement).
//
// Deadlines. The journal's writes go in batches; a batch runs until the
// soonest deadline of its callers' contexts, then ends, and its callers
// whose context ended are answered with their context's error and what
// is known of their write; the others' writes run again, each alone, in
// the order of their deadlines. A caller with a deadline is so never held
// past it by another's write that waits for a row lock (an operator's
// transaction, a session left holding one).
//
// Fail-over. A fleet follows the promotion of a standby when its pools
// connect with every server in the DSN and target_session_attrs=read-write
// (postgres://app@db1,db2/app?target_session_attrs=read-write). With a
// synchronous standby (synchronous_standby_names on the primary, the
// sessions' synchronous_commit on or remote_apply), every write the
// journal and the store make durable waits for the standby, and nothing
// acknowledged is lost; an outcome or a release, which does not wait, may
// be, and the operation then resumes as a status check once its lease
// lapses. With an asynchronous standby, whatever the standby had not
// received is lost: an intent with it (the operation is forgotten, and a
// Do with the same ID journals a new intent, under a new key unless keys
// are deterministic), and a key of the store (a retry with it runs the
// handler again). Either way no live worker is taken for dead: a worker
// found without its liveness lock before the promotion is judged afresh
// on the new primary, and has the whole LivenessGrace to take its lock
// there, whatever the privileges of the journal's role. The README's
// "When one machine is not enough" has the whole account.
//
// # The server store
//
// Store keeps the keys of package server's middleware for every replica of
// an API at once: a request retried on another replica finds its key, and
// concurrent requests with one key run its handler once across the fleet.
//
//	pool, err := pgxpool.New(ctx, dsn)          // the application's pool
//	store, err := postgres.OpenStore(ctx, pool) // schema "idem", migrated on open
//	mw, err := server.New(server.Config{Store: store, Scope: tenantOf})
//
// It passes server/storetest, the suite the SQLite store passes, and keeps
// the same promises.
//
// Tables. In the schema that Schema names ("idem" by default; the
// journal's may be the same): store_entries, one row per (scope, key),
// whose primary key id is the SHA-256 of the two (the scope's length
// first), holding the scope, key, fingerprint, method and path as bytes
// (bytea: a scope or key of any length, a path that decodes to bytes that
// are not UTF-8 or to a NUL, all kept byte for byte, as the memory and
// SQLite stores keep them), the state, the lock's token, the times, and
// once completed the response (status, header as JSON, or in a binary
// form marked by a first byte 0x01 when a name or value is not UTF-8,
// body); an index on expires_at for the sweeper;
// the sequence store_tokens; and idem_schema, the version of each kind of
// idem's tables. Times are nanoseconds since the Unix epoch, as in the
// SQLite store, because the middleware fences on them (a lock is stale
// when locked_at is before StaleBefore) and timestamptz would round them
// to microseconds. OpenStore migrates under an advisory lock, so replicas
// that start at once migrate once; MigrateStore does it alone, for teams
// that migrate apart, and WithoutMigration then refuses tables that
// are missing or older (ErrNotMigrated). Another program's table of
// the same name is refused (server.ErrNotStore), and so is a store written
// by a newer idem (server.ErrSchemaTooNew), changing nothing.
//
// Claims. A claim of a new key is INSERT ... ON CONFLICT (id) DO
// NOTHING: of any number of concurrent claims, in any number of replicas,
// the unique index lets one insert the row, and the others read the entry
// in their way. Neither reading nor finding the key taken writes anything.
// An expired entry is replaced by UPDATE ... WHERE expires_at <= now, and
// a stale lock (in progress, same fingerprint, locked before StaleBefore)
// is taken over by UPDATE ... WHERE state = in progress AND fingerprint =
// ... AND locked_at < StaleBefore. PostgreSQL evaluates those conditions
// again on the newest version of the row once it holds the row's lock, so
// of many concurrent take-overs exactly one matches; the others read the
// entry again.
//
// Tokens. Every claim, replacement and take-over draws its token from the
// sequence store_tokens, which caches nothing: no token is handed out twice
// in the schema, so the holder of a released or expired entry never
// matches a later one, and a take-over, which draws its token under the
// row's lock, always gets a greater one than the holder it fences off
// (fencing needs only that tokens are never reused; a claim that inserts a
// new row may, in a race with a release, get an older one than a previous
// holder's, never the same).
// Complete, Release and Renew change the row only WHERE token = the
// caller's AND state = in progress, and report server.ErrLockLost when no
// row matched.
//
// Durability. Each write sets synchronous_commit for its own transaction
// only (set_config with is_local, inside the statement: no extra round
// trip, nothing left on the application's sessions, and it works through a
// pooler in transaction mode), whatever the session's default, as the
// journal does, with the same statements. Claims, replacements, take-overs, lock
// renewals and completions wait for the WAL flush (a session whose
// setting is off is raised to on; any other, such as remote_apply, is
// kept). Releases and sweeps do not, and completions do not either with
// DeferCompletes: Store says what each choice costs when the database
// server crashes.
//
// Time. Locks and retention are judged on the database server's clock,
// as the journal's leases are: see Time below.
//
// Group commit. Claims of new keys that arrive together share one INSERT
// and one commit, and so do completions; a lone request sends its write at
// once. A Store therefore needs few connections: one per batch in flight
// and one per lookup.
//
// # Time
//
// What the journal and the store keep and judge by time (a lease's end, a
// lock's staleness, a key's retention, an operation's due time) is on the
// database server's clock, so that workers and replicas whose clocks
// disagree agree on it: a clock that runs ahead, by any amount, never
// takes a live worker's lease or a live handler's key, nor expires a kept
// response; one that runs behind never keeps a dead one's. Each Journal
// and Store reads clock_timestamp() when it opens, and again every 30
// seconds on a claim or a renewal, and keeps the offset between that clock
// and its process's own, to within half the round trip of the reading
// (an offset within that error is taken as none). The times a caller
// passes in (the middleware's Now, StaleBefore and ExpiresAt; a record's
// lease end, retention and next attempt) are moved onto the server's
// clock by that offset, and the times it reads back are moved onto its own,
// so that a worker whose clock is an hour off still sees a 15-second lease
// end 15 seconds from its now. The journal keeps the offset in whole
// milliseconds, its unit of time; the store in nanoseconds, as it keeps
// its times. A step of a process's clock is followed within 30 seconds;
// until then its times are off by the step. The times stored are on the
// clock of the server that stored them: across a fail-over, keep the
// servers' clocks synchronised, for a promoted standby whose clock runs
// ahead sees the old primary's leases end that much sooner.
package postgres
