package postgres

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/journal"
	"github.com/idemkit/idem/postgres/internal/pgschema"
)

// Journal is an idem.Journal in PostgreSQL, shared by every worker of a
// fleet: each worker's idem.Client opens it on its own pool, and Resume
// takes up the operations of workers that died. It is safe for concurrent
// use.
//
// # Durability
//
// A write that records an intent (Create, Claim, Acquire, an Update with
// idem.Durable) and Sync are committed with synchronous_commit on, set by
// the journal for its own transaction whatever the session's default (a
// database or a role may default to off): it is in the server's WAL on
// disk before the call returns, and so before anything is sent. A stronger
// level the application's sessions run at (remote_apply, say) is kept. A Deferred or Buffered update (an outcome the server can tell
// again) is committed with synchronous_commit off: it returns once
// committed, before the WAL is flushed, which the server does within
// wal_writer_delay (200 ms by default); a crash of the database server in
// between may lose it, and the record then reads as before (in_flight),
// which resumes as a status check that returns the same outcome. A
// Buffered write is committed before Update returns, as a Deferred one.
//
// # Group commit
//
// Writes that arrive together from many goroutines share one transaction,
// two round trips and one commit: the rows they touch are read and locked
// in one statement, the journal's rules (package journal) are applied in
// Go, and every change is sent with the commit in one pipeline. A write the
// rules refuse fails only its caller. Should the batch's transaction fail
// as a whole (a deadlock with another process, say), its writes are run
// again one by one. One batch runs at a time, and a second beside it only
// while many writes (32) wait for the first: with many writers, the second
// takes the writes that would wait and both commits share a WAL flush;
// with few, every write waits for one batch, as if there were no second.
//
// A batch of creates and of updates of rows this journal wrote last (Do's
// path: the intent, then the outcome) takes one round trip: the journal
// keeps a copy of each active row it wrote, applies the rules to the copy,
// and writes each row only if no one has changed it since (its xmin is
// still the transaction that wrote the copy, and it holds the same
// operation at the same version: a fail-over to an asynchronous standby
// hands out a lost row's id and transaction id again). A write that finds its row
// changed, or its operation or key taken, or that the rules refuse against
// the copy, runs again through the read. Such a batch needs no BEGIN and
// no COMMIT: its statements run in the implicit transaction that the
// server commits at the pipeline's end, and a write alone in its batch (at
// one caller, every write) is one statement, which sets its commit level
// itself.
//
// # Liveness
//
// Register holds an advisory lock, on a connection of its own and in a
// transaction left open, keyed by the schema's owners table and the
// owner's number in it, for as long as the owner is registered:
// PostgreSQL drops it when that session ends, whether the worker exited,
// crashed, or lost its network, directly or behind a transaction pooler.
// Should the session end while the worker lives on, the journal takes the
// lock again on a new session at once. Claim and Acquire take the leases
// of an owner whose lock has stayed free for LivenessGrace, or that
// unregistered, at once; WithoutLiveness leaves them to lapse.
type Journal struct {
	pool     *pgxpool.Pool
	schema   string
	maxBody  int
	maxBatch int
	onCommit func(idem.CommitInfo) // OnCommit's, or nil
	// idleInTx, set by tests only, runs where a transaction is open between
	// two round trips (readBatch's, inTx's before its commit): where a
	// descheduled process leaves its session idle in the transaction.
	idleInTx func(pid uint32)
	liveness bool
	readOnly bool          // ReadOnly: reads in READ ONLY transactions, writes refused
	grace    time.Duration // LivenessGrace
	clock    *dbClock      // the database server's: see the package documentation

	ownersOID uint32 // the owners table's: the first key of its liveness locks

	q queries // statements with the schema's name in them

	mu       sync.Mutex
	closed   bool
	queue    []*writeReq
	running  int                      // commit goroutines
	mine     map[string]*registration // owners registered through this journal
	draining sync.WaitGroup

	copiesMu sync.Mutex
	copies   map[string]rowCopy // the rows this journal wrote last (see fastBatch)

	bound atomic.Pointer[batchBound] // the batches' (see batchContext)

	// The watch of stuck batches (see watchBatches), guarded by mu but for
	// unwatch and watched.
	batches  uint64 // batches begun
	watching bool
	unwatch  chan struct{} // closed by Close
	watched  sync.WaitGroup

	// The endings of abandoned sessions (see endAbandoned), counted in
	// watched: life ends at Close.
	life     context.Context
	stopLife context.CancelFunc
	pids     atomic.Int32 // see serverPIDs
}

var _ idem.Journal = (*Journal)(nil)

// MigrateJournal creates or migrates the journal's tables in schema, and
// nothing else: for teams that run migrations apart from the application.
// It refuses, changing nothing, a schema that holds another program's
// tables (idem.ErrNotJournal) or newer ones (idem.ErrSchemaTooNew).
func MigrateJournal(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if pool == nil {
		return errors.New("postgres: MigrateJournal needs a *pgxpool.Pool; open one with pgxpool.New")
	}
	return migrate(ctx, pool, schema, journalKind)
}

// OpenJournal returns the journal in pool's database, migrating its tables
// first unless WithoutMigration. It refuses, changing nothing, a schema
// that holds another program's tables (idem.ErrNotJournal), a journal
// written by a newer idem (idem.ErrSchemaTooNew), and, without migration,
// tables that are missing or older (ErrNotMigrated); and a journal with
// liveness whose role may not read and insert into server_up (see the package
// doc's Privileges). The pool belongs to the application; the journal
// never closes it.
func OpenJournal(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (*Journal, error) {
	cfg := newOptions(opts)
	if pool == nil {
		return nil, errors.New("postgres: OpenJournal needs a *pgxpool.Pool; open one with pgxpool.New")
	}
	if err := cfg.check("OpenJournal", cfg.storeOnly, "OpenStore"); err != nil {
		return nil, err
	}
	if cfg.maxBatch < 1 {
		return nil, fmt.Errorf("postgres: MaxBatch %d: at least 1", cfg.maxBatch)
	}
	if cfg.maxBody < 1 {
		return nil, fmt.Errorf("postgres: MaxBodySize %d: at least 1", cfg.maxBody)
	}
	if cfg.grace < 0 {
		return nil, fmt.Errorf("postgres: LivenessGrace %v: zero or more", cfg.grace)
	}
	if cfg.migrate {
		if err := MigrateJournal(ctx, pool, cfg.schema); err != nil {
			return nil, err
		}
	}
	if err := readsBytea(ctx, pool, "journal", cfg.schema); err != nil {
		return nil, err
	}
	var ownersOID uint32
	clock := newDBClock()
	err := readOn(ctx, pool, cfg.readOnly, func(q reader) error {
		if !cfg.migrate {
			v, err := pgschema.Version(ctx, q, cfg.schema, journalKind)
			if err != nil {
				return err
			}
			if want := len(journalKind.Migrations); v != want {
				return notMigrated("journal", cfg.schema, v, want, "MigrateJournal")
			}
		}
		if err := q.QueryRow(ctx, `SELECT $1::regclass::oid`, pgschema.Ident(cfg.schema)+".owners").Scan(&ownersOID); err != nil {
			return err
		}
		if cfg.liveness && !cfg.readOnly {
			if err := mayMarkServerUp(ctx, q, cfg.schema); err != nil {
				return err
			}
		}
		return clock.refresh(ctx, q)
	})
	if err != nil {
		return nil, classify(ctx, err)
	}
	j := &Journal{ownersOID: ownersOID, pool: pool, readOnly: cfg.readOnly, schema: cfg.schema, maxBody: cfg.maxBody, maxBatch: cfg.maxBatch,
		liveness: cfg.liveness, grace: cfg.grace, onCommit: cfg.onCommit, clock: clock, q: newQueries(cfg.schema),
		mine: map[string]*registration{}, copies: map[string]rowCopy{}, unwatch: make(chan struct{})}
	j.life, j.stopLife = context.WithCancel(context.Background())
	return j, nil
}

// Schema returns the name of the schema that holds the journal.
func (j *Journal) Schema() string { return j.schema }

// MaxBodySize is the largest request body the journal accepts
// (MaxBodySize option): idem.Client.RoundTripper reads no more of a body.
func (j *Journal) MaxBodySize() int { return j.maxBody }

// Close waits for the writes in progress and refuses later calls with
// idem.ErrJournalClosed. It ends the registrations still held, as their
// unregister functions do: other journals see their owners gone at once.
// It does not close the pool.
func (j *Journal) Close() error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return idem.ErrJournalClosed
	}
	j.closed = true
	j.mu.Unlock()
	j.draining.Wait()
	close(j.unwatch)
	j.stopLife()
	j.watched.Wait()
	stopBatchBound(&j.bound)
	j.mu.Lock()
	mine := j.mine
	j.mine = map[string]*registration{}
	j.mu.Unlock()
	// The registrations end side by side: on a database that does not
	// answer, each end takes up to its bound (endTimeout), and a shutdown
	// then costs one end, not one per registration.
	errs := make([]error, 0, len(mine))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, r := range mine {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := j.end(r); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("postgres journal in schema %q: ending owner %q's registration: %w", j.schema, r.owner, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// enterWrite is enter for a method that writes: a ReadOnly journal
// refuses it.
func (j *Journal) enterWrite(ctx context.Context) (func(), error) {
	if j.readOnly {
		return nil, openedReadOnly{where: j.where()}
	}
	return j.enter(ctx)
}

// openedReadOnly is a ReadOnly journal's refusal of a write: it matches
// ErrReadOnly, whose own message speaks of the database instead.
type openedReadOnly struct{ where string }

func (e openedReadOnly) Error() string {
	return e.where + ": the journal was opened ReadOnly and refuses writes: open it without ReadOnly to write"
}

func (e openedReadOnly) Is(target error) bool { return target == ErrReadOnly }

// reader is a pool or a transaction, for statements that only read.
type reader interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// readOnlyTx is how a ReadOnly journal begins the transaction of each
// read: READ ONLY, so that the server refuses a write; at read committed,
// whatever the session's default (see beginTx).
var readOnlyTx = pgx.TxOptions{IsoLevel: pgx.ReadCommitted, AccessMode: pgx.ReadOnly}

// read runs fn, which reads, on the pool; on a ReadOnly journal, in a
// transaction begun READ ONLY. fn consumes the rows it queries, and sets
// whatever it returns afresh: it runs again on another session when its
// session was ended, for idling, terminated or broken (onLiveSessionRead).
func (j *Journal) read(ctx context.Context, fn func(q reader) error) error {
	return readOn(ctx, j.pool, j.readOnly, fn)
}

// readOn is read on pool, before the journal exists.
func readOn(ctx context.Context, pool *pgxpool.Pool, readOnly bool, fn func(q reader) error) error {
	return onLiveSessionRead(ctx, pool, func() error {
		if !readOnly {
			return fn(pool)
		}
		return pgx.BeginTxFunc(ctx, pool, readOnlyTx, func(tx pgx.Tx) error { return fn(tx) })
	})
}

func (j *Journal) enter(ctx context.Context) (func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return nil, idem.ErrJournalClosed
	}
	j.draining.Add(1)
	return j.draining.Done, nil
}

// classify maps the server's errors: a canceled context stays one.
func classify(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err)) {
		return ctx.Err()
	}
	return err
}

// fail is the error of what, a call that failed with err: a canceled
// context stays one; any other error names the journal and what failed,
// and says what to do when the statement ran past statement_timeout.
func (j *Journal) fail(ctx context.Context, what string, err error) error {
	if err = classify(ctx, err); err == nil || err == ctx.Err() {
		return err
	}
	return fmt.Errorf("%s: %s: %w%s", j.where(), what, asReadOnly(err), timeoutAdvice(err))
}

// Create implements idem.Journal.
func (j *Journal) Create(ctx context.Context, rec idem.Record) (idem.Record, bool, error) {
	off := j.off()
	nr, ev, err := journal.NewRecord(shiftRecord(rec, off), j.now(), j.maxBody)
	if err != nil {
		return idem.Record{}, false, err
	}
	w := &writeReq{op: opCreate, key: nr.Key, rec: nr, ev: ev, dur: idem.Durable}
	if err := j.write(ctx, w); err != nil {
		if errors.Is(err, idem.ErrFingerprintMismatch) {
			return shiftRecord(journal.CloneRecord(w.out), -off), false, err
		}
		return idem.Record{}, false, err
	}
	return shiftRecord(journal.CloneRecord(w.out), -off), w.created, nil
}

// Update implements idem.Journal.
func (j *Journal) Update(ctx context.Context, rec idem.Record, d idem.Durability, why idem.Event) (idem.Record, error) {
	if err := journal.CheckDurability(d); err != nil {
		return idem.Record{}, err
	}
	off := j.off()
	// rec is not cloned: the rules take only its scalars and a clone of its
	// Response (journal.ApplyUpdate), never its request's Header or Body,
	// and nothing holds it once the write returns.
	w := &writeReq{op: opUpdate, key: rec.Key, rec: shiftRecord(rec, off), ev: why, dur: d}
	if err := j.write(ctx, w); err != nil {
		return idem.Record{}, err
	}
	return shiftRecord(journal.CloneRecord(w.out), -off), nil
}

// Acquire implements idem.Journal.
func (j *Journal) Acquire(ctx context.Context, key, owner string, lease time.Duration) (idem.Record, error) {
	off := j.off()
	w := &writeReq{op: opAcquire, key: key, owner: owner, lease: lease, dur: idem.Durable}
	err := j.write(ctx, w)
	return shiftRecord(journal.CloneRecord(w.out), -off), err
}

// Release implements idem.Journal. A lost release only delays the next
// claim until the lease lapses, so it is deferred.
func (j *Journal) Release(ctx context.Context, key string, l idem.Lease) error {
	return j.write(ctx, &writeReq{op: opRelease, key: key, held: l, dur: idem.Deferred})
}

// Get implements idem.Journal.
func (j *Journal) Get(ctx context.Context, key string) (idem.Record, error) {
	return j.readOne(ctx, "key "+key, j.q.byKey, key)
}

// Lookup implements idem.Journal.
func (j *Journal) Lookup(ctx context.Context, scope, id string) (idem.Record, error) {
	return j.readOne(ctx, scope+"/"+id, j.q.byOp, scope, id)
}

func (j *Journal) readOne(ctx context.Context, what, query string, args ...any) (idem.Record, error) {
	done, err := j.enter(ctx)
	if err != nil {
		return idem.Record{}, err
	}
	defer done()
	off := j.off()
	var rec idem.Record
	err = j.read(ctx, func(q reader) (err error) {
		_, rec, err = scanRecord(q.QueryRow(ctx, query, args...))
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.Record{}, journal.NotFound(what)
	}
	return shiftRecord(rec, -off), j.fail(ctx, "the read of operation "+what, err)
}

// Claim implements idem.Journal. Workers claim with FOR UPDATE SKIP LOCKED:
// two workers claiming at once take different operations, and neither
// waits for the other.
func (j *Journal) Claim(ctx context.Context, req idem.ClaimRequest) ([]idem.Record, error) {
	if err := journal.CheckClaimRequest(req); err != nil {
		return nil, err
	}
	done, err := j.enterWrite(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	if err := onLiveSessionRead(ctx, j.pool, func() error { return j.clock.refresh(ctx, j.pool) }); err != nil {
		return nil, j.fail(ctx, "claim by "+req.Owner, err)
	}
	off := j.off()
	var out []idem.Record
	err = j.inTx(ctx, func(tx pgx.Tx) error {
		out = out[:0]
		now := j.now()
		due := now
		if dueBy := req.DueBy.Add(off); !req.DueBy.IsZero() && dueBy.Before(now) {
			due = dueBy
		}
		q := j.q.claim
		claimable := func(gone []string) (ids []int64, recs []idem.Record, err error) {
			rows, err := tx.Query(ctx, q, wire.Millis(due), wire.Millis(now), gone, req.Scope, req.URLPrefix, req.Limit)
			if err != nil {
				return nil, nil, err
			}
			defer rows.Close()
			for rows.Next() {
				id, rec, err := scanRecord(rows)
				if err != nil {
					return nil, nil, err
				}
				ids, recs = append(ids, id), append(recs, rec)
			}
			return ids, recs, rows.Err()
		}
		// Free operations first: while they fill the claim, the owners of
		// live leases need not be looked up (a query over every due
		// leased operation, and one more per owner). A claim they do not
		// fill looks again, taking gone owners' operations too; the rows
		// it locked the first time are its own and are read again.
		ids, recs, err := claimable(nil)
		if err != nil {
			return err
		}
		var gone []string // judged once for this claim
		if len(recs) < req.Limit {
			if gone, err = j.goneOwners(ctx, tx, due, now); err != nil {
				return err
			}
			if len(gone) > 0 {
				if ids, recs, err = claimable(gone); err != nil {
					return err
				}
			}
		}
		b := &pgx.Batch{}
		b.Queue(commitDurable) // a claim is an intent: on disk before its owner sends
		for i, rec := range recs {
			claimed, ev, err := journal.ApplyClaim(rec, req.Owner, req.Lease, now, func(o string) bool { return slices.Contains(gone, o) })
			if err != nil {
				return err
			}
			j.q.queueStore(b, ids[i], rec, claimed)
			j.q.queueEvent(b, ids[i], ev)
			out = append(out, shiftRecord(claimed, -off))
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if asDoubt(err) != nil && len(out) == 0 {
		return nil, nil // nothing was claimed: nothing to be in doubt about
	}
	if d := asDoubt(err); d != nil {
		// The claims are written with their events: found, they are this
		// call's, which its owner must drive; lost, they would be held by
		// no call until their leases lapsed.
		rctx, cancel := readBackCtx(ctx)
		defer cancel()
		found, rerr := j.written(rctx, d, out[:1])
		switch {
		case rerr != nil:
			return nil, inDoubt(j.where()+": "+describeClaim(req.Owner, out), d.err, rerr)
		case len(found) == 1 && found[0]:
			return out, nil
		}
		return nil, fmt.Errorf("%s: %s: its commit's acknowledgement was lost (%w), and it was not committed; claim again",
			j.where(), describeClaim(req.Owner, out), d.err)
	}
	if err != nil {
		return nil, j.fail(ctx, "claim by "+req.Owner, err)
	}
	return out, nil
}

// Renew implements idem.Journal: one statement per lease, each finding its
// row through the key's index, all sent at once in one transaction,
// committed without waiting for the WAL's flush (a lost renewal only lets
// a lease lapse sooner).
func (j *Journal) Renew(ctx context.Context, held map[string]idem.Lease, lease time.Duration) (int, error) {
	done, err := j.enterWrite(ctx)
	if err != nil {
		return 0, err
	}
	defer done()
	if len(held) == 0 {
		return 0, nil
	}
	if err := onLiveSessionRead(ctx, j.pool, func() error { return j.clock.refresh(ctx, j.pool) }); err != nil {
		return 0, j.fail(ctx, "the renewal of leases", err)
	}
	keys := slices.Sorted(maps.Keys(held)) // rows are locked in key order, as every batch does
	until := wire.Millis(journal.TruncateTime(j.now().Add(lease)))
	renew := func(ctx context.Context) (int, error) {
		var n int64
		err := j.inTx(ctx, func(tx pgx.Tx) error {
			n = 0
			b := &pgx.Batch{}
			b.Queue(commitDeferred)
			for _, k := range keys {
				b.Queue(j.q.renew, k, held[k].Epoch, held[k].Owner, until).Exec(func(tag pgconn.CommandTag) error {
					n += tag.RowsAffected()
					return nil
				})
			}
			return tx.SendBatch(ctx, b).Close()
		})
		return int(n), err
	}
	n, err := renew(ctx)
	if d := asDoubt(err); d != nil {
		// A renewal sets each lease's expiry to the later of its own and
		// the new one: run again once the first has settled, it changes
		// nothing the first did, and counts the leases still held.
		rctx, cancel := readBackCtx(ctx)
		defer cancel()
		if err := settle(rctx, j.pool, d); err != nil {
			return 0, inDoubt(j.where()+": "+fmt.Sprintf("the renewal of %d leases", len(keys)), d.err, err)
		}
		n, err = renew(rctx)
	}
	return n, j.fail(ctx, "the renewal of leases", err)
}

// inTx runs fn in a transaction on a connection of the pool, again on
// another session when the server ended its session before anything of it
// committed (endedForTx: fn must set its results anew at each run), and
// reports a commit sent without an answer as a commitDoubt. (pgx.BeginFunc would
// report the rollback's "conn closed" after such a commit instead.)
func (j *Journal) inTx(ctx context.Context, fn func(pgx.Tx) error) error {
	return retryEnded(ctx, j.pool, endedForTx, func() error { return j.inTxOnce(ctx, fn) })
}

func (j *Journal) inTxOnce(ctx context.Context, fn func(pgx.Tx) error) error {
	conn, err := j.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	began := j.clock.local()
	tx, err := conn.BeginTx(ctx, readCommitted) // see beginTx
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback(ctx)
		j.endAbandoned(conn.Conn(), began, err)
		return err
	}
	if j.idleInTx != nil {
		j.idleInTx(conn.Conn().PgConn().PID())
	}
	return doubtful(conn.Conn(), tx.Commit(ctx))
}

// Sync implements idem.Journal: a commit with synchronous_commit on flushes
// the WAL up to it, and with it every commit made before without waiting.
func (j *Journal) Sync(ctx context.Context) error {
	done, err := j.enterWrite(ctx)
	if err != nil {
		return err
	}
	defer done()
	sync := func(ctx context.Context) error {
		conn, err := j.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer conn.Release()
		_, err = conn.Exec(ctx, `UPDATE `+j.q.table("sync")+` AS s SET at = $1 FROM (`+commitDurable+`) AS d WHERE s.id = 1`,
			wire.Millis(j.now()))
		return doubtful(conn.Conn(), err)
	}
	err = onLiveSession(ctx, j.pool, func() error { return sync(ctx) })
	// A caller whose ctx ended has stopped waiting for durability (a
	// shutdown out of time): the sync is failed, not read back past ctx.
	if d := asDoubt(err); d != nil && ctx.Err() == nil {
		// Committed or not, a Sync run again once the first has settled
		// flushes the WAL as far as the first would have.
		rctx, cancel := readBackCtx(ctx)
		defer cancel()
		if err := settle(rctx, j.pool, d); err != nil {
			return inDoubt(j.where()+": "+"the sync", d.err, err)
		}
		err = sync(rctx)
	}
	return j.fail(ctx, "the sync", err)
}

// listPage is how many records List reads per query.
const listPage = 256

// List implements idem.Journal.
func (j *Journal) List(ctx context.Context, f idem.Filter) iter.Seq2[idem.Record, error] {
	return func(yield func(idem.Record, error) bool) {
		states := make([]int16, 0, len(f.States))
		for _, s := range f.States {
			states = append(states, int16(s))
		}
		var after int64
		if f.After != "" {
			var err error
			if after, err = j.rowID(ctx, f.After); err != nil {
				yield(idem.Record{}, err)
				return
			}
		}
		for {
			page, last, err := j.listPage(ctx, f, states, after)
			if err != nil {
				yield(idem.Record{}, err)
				return
			}
			for _, rec := range page {
				if !yield(rec, nil) {
					return
				}
			}
			if len(page) < listPage {
				return
			}
			after = last
		}
	}
}

// rowID is the position in List's order of the record with the given
// key: its id.
func (j *Journal) rowID(ctx context.Context, key string) (int64, error) {
	done, err := j.enter(ctx)
	if err != nil {
		return 0, err
	}
	defer done()
	var id int64
	err = j.read(ctx, func(q reader) error {
		return q.QueryRow(ctx, `SELECT id FROM `+j.q.operations+` WHERE key = $1`, key).Scan(&id)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, journal.CursorNotFound(key)
	}
	return id, j.fail(ctx, "the read of operation "+key, err)
}

func (j *Journal) listPage(ctx context.Context, f idem.Filter, states []int16, after int64) ([]idem.Record, int64, error) {
	done, err := j.enter(ctx)
	if err != nil {
		return nil, 0, err
	}
	defer done()
	created := int64(0)
	off := j.off()
	if !f.CreatedBefore.IsZero() {
		created = wire.Millis(f.CreatedBefore.Add(off))
	}
	var page []idem.Record
	var id int64
	err = j.read(ctx, func(q reader) error {
		page, id = nil, 0
		rows, err := q.Query(ctx, `SELECT `+recordColumns+` FROM `+j.q.operations+`
			WHERE id > $1 AND ($2 = '' OR scope = $2) AND (cardinality($3::smallint[]) = 0 OR state = ANY($3))
			AND ($4::bigint = 0 OR created_at < $4) ORDER BY id LIMIT `+fmt.Sprint(listPage), after, f.Scope, states, created)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var rec idem.Record
			if id, rec, err = scanRecord(rows); err != nil {
				return err
			}
			page = append(page, shiftRecord(rec, -off))
		}
		return rows.Err()
	})
	if err != nil {
		return nil, 0, j.fail(ctx, "listing operations", err)
	}
	return page, id, nil
}

// Count implements idem.Journal.
func (j *Journal) Count(ctx context.Context) ([]idem.Count, error) {
	done, err := j.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	var out []idem.Count
	err = j.read(ctx, func(q reader) error {
		out = nil
		rows, err := q.Query(ctx, `SELECT scope, state, count(*), min(created_at) FROM `+j.q.operations+`
			GROUP BY scope, state ORDER BY scope, state`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var c idem.Count
			var state int16
			var n, oldest int64
			if err := rows.Scan(&c.Scope, &state, &n, &oldest); err != nil {
				return err
			}
			c.State, c.N, c.Oldest = idem.State(state), int(n), wire.FromMillis(oldest).Add(-j.off())
			out = append(out, c)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, j.fail(ctx, "counting operations", err)
	}
	return out, nil
}

// History implements idem.Journal.
func (j *Journal) History(ctx context.Context, key string) ([]idem.Event, error) {
	done, err := j.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	// The events written, the creation event the row keeps, then the one
	// the row holds (of its version, the last), read in one statement: a write between two reads could move
	// the row's event into events after the first.
	var out []idem.Event
	found := true
	err = j.read(ctx, func(q reader) error {
		out, found = nil, true
		rows, err := q.Query(ctx, `WITH o AS (SELECT `+heldEvent+`, `+keptColumns+` FROM `+j.q.operations+` WHERE key = $1)
			SELECT version, at, kind, detail, from_state, to_state, attempt, status, error, owner
			FROM `+j.q.events+` WHERE op = (SELECT id FROM o)
			UNION ALL SELECT 1, `+keptColumns+` FROM o WHERE cr_kind IS NOT NULL
			UNION ALL SELECT version, ev_at, ev_kind, ev_detail, ev_from, state, attempts, resp_status, ev_error, ev_owner
			FROM o WHERE ev_kind IS NOT NULL
			UNION ALL SELECT NULL, 0, 0, NULL, NULL, 0, 0, NULL, NULL, NULL WHERE NOT EXISTS (SELECT FROM o)
			ORDER BY 1`, key)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var version *int64
			var ev idem.Event
			var at int64
			var kind int16
			var from *int16
			var to int16
			var attempt int32
			var status *int32
			var detail, msg, owner *string
			if err := rows.Scan(&version, &at, &kind, &detail, &from, &to, &attempt, &status, &msg, &owner); err != nil {
				return err
			}
			if version == nil {
				found = false
				continue
			}
			ev.Version = *version
			ev.At, ev.Kind, ev.To, ev.Attempt = wire.FromMillis(at).Add(-j.off()), idem.EventKind(kind), idem.State(to), int(attempt)
			if from != nil {
				ev.From = idem.State(*from)
			}
			if status != nil {
				ev.StatusCode = int(*status)
			}
			ev.Detail, ev.Error, ev.Owner = deref(detail), deref(msg), deref(owner)
			out = append(out, ev)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, j.fail(ctx, "the history of operation "+key, err)
	}
	if !found {
		return nil, journal.NotFound("key " + key)
	}
	return out, nil
}

// pruneChunk is how many records Prune deletes per transaction.
const pruneChunk = 500

// Prune implements idem.Journal. Each chunk of operations and their events
// is deleted in one transaction, the events by a statement of their own:
// it sees every event committed before it ran, including one written by a
// transaction the delete of its operation had waited for, which a single
// statement's snapshot would not.
func (j *Journal) Prune(ctx context.Context, before time.Time) (int, error) {
	done, err := j.enterWrite(ctx)
	if err != nil {
		return 0, err
	}
	defer done()
	total := 0
	for {
		var ids []int64
		err := retryEnded(ctx, j.pool, endedForTx, func() error {
			return pgx.BeginTxFunc(ctx, j.pool, readCommitted, func(tx pgx.Tx) error {
				ids = ids[:0]
				rows, err := tx.Query(ctx, `DELETE FROM `+j.q.operations+` WHERE id IN (
				SELECT id FROM `+j.q.operations+` WHERE state IN (4, 5, 7) AND updated_at < $1 ORDER BY id LIMIT $2)
				RETURNING id`, wire.Millis(before.Add(j.off())), pruneChunk)
				if err != nil {
					return err
				}
				if ids, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil || len(ids) == 0 {
					return err
				}
				// Planned for these ids each time (not prepared): the generic
				// plan of op = ANY($1), made on a small table, would scan it.
				_, err = tx.Exec(ctx, `DELETE FROM `+j.q.table("events")+` WHERE op = ANY($1)`, pgx.QueryExecModeExec, ids)
				return err
			})
		})
		if err != nil {
			return total, j.fail(ctx, "pruning settled operations", err)
		}
		total += len(ids)
		if len(ids) < pruneChunk {
			return total, nil
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// table is the schema-qualified name of one of the journal's tables.
func (q queries) table(name string) string { return pgschema.Ident(q.schema) + "." + name }

// now is the database server's time: what the journal writes and judges
// leases by.
func (j *Journal) now() time.Time { return j.clock.local().Add(j.off()) }

// off is the offset that moves this process's times onto the database
// server's clock, in whole milliseconds, the journal's unit: a time moved
// there and back comes back as it was.
func (j *Journal) off() time.Duration { return j.clock.off().Round(time.Millisecond) }

// shiftRecord moves rec's times by off: a caller's onto the server's
// clock on the way in (the times a client sets: the lease's end, the next
// attempt, the retention), and every time back on the way out.
func shiftRecord(rec idem.Record, off time.Duration) idem.Record {
	if off == 0 {
		return rec
	}
	shift := func(t *time.Time) {
		if !t.IsZero() {
			*t = t.Add(off)
		}
	}
	shift(&rec.NextAttemptAt)
	shift(&rec.ExpiresAt)
	shift(&rec.Lease.ExpiresAt)
	if off < 0 {
		shift(&rec.CreatedAt)
		shift(&rec.UpdatedAt)
	}
	return rec
}
