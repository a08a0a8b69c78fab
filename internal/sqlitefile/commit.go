package sqlitefile

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"time"
)

// Tx runs a write's statements on the writer connection, inside the batch's
// transaction and the write's own savepoint.
type Tx struct {
	conn   *sql.Conn
	replay bool
}

// Replay reports whether the write is being run again because the
// transaction that first carried it was rolled back after it had returned
// (see Buffered). Its caller is gone: it must not hand results back, and
// it may now fail where it first succeeded, if another process changed
// what it read.
func (t *Tx) Replay() bool { return t.replay }

// The batch's statements run on a context of their own: one caller giving
// up must not abort a transaction that carries other callers' writes.
var batchCtx = context.Background()

// Exec runs a statement that returns no rows.
func (t *Tx) Exec(query string, args ...any) (sql.Result, error) {
	return t.conn.ExecContext(batchCtx, query, args...)
}

// Query runs a statement that returns rows.
func (t *Tx) Query(query string, args ...any) (*sql.Rows, error) {
	return t.conn.QueryContext(batchCtx, query, args...)
}

// QueryRow runs a statement that returns at most one row.
func (t *Tx) QueryRow(query string, args ...any) *sql.Row {
	return t.conn.QueryRowContext(batchCtx, query, args...)
}

// Mode says when Write returns, and so what a crash may take back.
type Mode uint8

const (
	// Durable returns after the write's transaction is on disk.
	Durable Mode = iota
	// Deferred returns after the write's transaction is committed, before
	// its fsync: a process crash keeps it, a power failure may not. It is
	// on disk with the next durable commit or within FlushInterval.
	Deferred
	// Buffered returns once the write has run in the writer's open
	// transaction, before that transaction is committed: its statements'
	// errors reach the caller, and reads through Reader see it once
	// CommitBuffered has run. The transaction stays open for the next
	// writes to join, so that a buffered write and the durable one that
	// usually follows it share one commit; it is committed by the next
	// write that is not buffered, or within LingerDelay. A crash before
	// then, or a later write's commit failing, loses it: use it only for
	// writes whose loss the caller can repair.
	Buffered
)

type writeReq struct {
	ctx  context.Context
	mode Mode
	fn   func(*Tx) error // nil for CommitBuffered's empty write
	done chan error      // the write's result
	lead chan struct{}   // the lead is passed to this write
}

// Stats counts what the committer and the checkpointer did.
type Stats struct {
	// Writes is the number of write functions run.
	Writes int64
	// DurableCommits and DeferredCommits count transactions committed with
	// and without waiting for fsync.
	DurableCommits  int64
	DeferredCommits int64
	// MaxBatch is the largest number of writes seen in one transaction.
	MaxBatch int
	// Flushes counts fsyncs of the WAL made for deferred commits.
	Flushes int64
	// Checkpoints counts checkpoints run by the checkpointer.
	Checkpoints int64
	// LostBuffered counts buffered writes that were rolled back after they
	// had returned, because the commit that was to carry them failed, and
	// that no longer applied when run again. Replayed counts those run again.
	LostBuffered int64
	Replayed     int64
}

// Stats returns the counters so far.
func (db *DB) Stats() Stats {
	db.statsMu.Lock()
	defer db.statsMu.Unlock()
	return db.stats
}

// Write runs fn in a write transaction and returns its error, or the
// commit's, at the time mode says. Writes that arrive together from many
// goroutines share one transaction and one fsync (group commit); each runs
// in its own savepoint, so a write that fails is rolled back alone and
// fails only its caller.
//
// The group commit needs no goroutine of its own: the first writer to find
// no commit in progress leads, commits every write queued by then (its own
// first), and hands the lead to the oldest write still queued, if any, before
// returning. A lone writer thus commits on its own goroutine, with no
// hand-off, and a writer that arrives during a commit waits for that one
// commit only, then joins the next.
//
// A transaction is committed with fsync when one of its writes is Durable,
// without when none is; one made only of Buffered writes is left open for
// the next writes (see Buffered). With MaxBatch 1 every write is committed
// on its own and nothing is left open.
//
// Once queued, Write waits for its turn even if ctx is canceled, so that it
// never reports a failure for a write that was committed; a write whose ctx
// is canceled before its turn is skipped.
func (db *DB) Write(ctx context.Context, mode Mode, fn func(*Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := db.errIfReadOnly(); err != nil {
		return err
	}
	req := &writeReq{ctx: ctx, mode: mode, fn: fn, done: make(chan error, 1), lead: make(chan struct{}, 1)}
	db.queueMu.Lock()
	if db.closed {
		db.queueMu.Unlock()
		return db.ErrIfClosed()
	}
	db.writers.Add(1)
	defer db.writers.Done()
	db.queue = append(db.queue, req)
	leader := !db.leading
	db.leading = true
	db.queueMu.Unlock()
	if !leader {
		select {
		case err := <-req.done:
			return err
		case <-req.lead:
		}
	}
	db.lead()
	return <-req.done
}

// CommitBuffered commits the buffered writes still in the open transaction,
// if any, without waiting for fsync: a read that must see them calls it
// first. It costs one atomic load when nothing is buffered.
//
// If the commit that was to carry them failed, they are run again in a new
// transaction and committed; if that fails too, its error is returned and
// they stay pending.
func (db *DB) CommitBuffered(ctx context.Context) error {
	if !db.buffered.Load() {
		return nil
	}
	return db.Write(ctx, Deferred, nil)
}

// lead commits the writes at the head of the queue (the leader's own among
// them), then passes the lead on or gives it up.
func (db *DB) lead() {
	db.queueMu.Lock()
	n := min(len(db.queue), db.opts.MaxBatch)
	batch := append(db.batch[:0], db.queue[:n]...)
	db.queue = db.queue[n:]
	db.queueMu.Unlock()

	db.runBatch(batch)
	if !db.inTx {
		db.truncateIfLarge()
	}
	clear(batch)
	db.batch = batch

	db.queueMu.Lock()
	defer db.queueMu.Unlock()
	if len(db.queue) == 0 {
		db.leading = false
		db.queue = nil
		return
	}
	db.queue[0].lead <- struct{}{}
}

// runBatch runs the batch's writes in the writer's transaction, beginning
// one unless buffered writes left one open, and commits it as its most
// demanding write requires, or leaves it open if every write is buffered.
func (db *DB) runBatch(reqs []*writeReq) {
	var start time.Time
	if db.opts.OnCommit != nil {
		start = time.Now()
	}
	mode := Buffered
	for _, r := range reqs {
		mode = min(mode, r.mode)
	}
	if mode == Buffered && db.opts.MaxBatch == 1 {
		mode = Deferred // MaxBatch 1: every write its own transaction
	}
	if ackEarly && mode == Durable {
		mode = Deferred // a deliberately broken build: see ackearly_on.go
	}
	results := make([]error, len(reqs))
	sent := make([]bool, len(reqs))
	reply := func(i int, err error) {
		if !sent[i] {
			sent[i] = true
			reqs[i].done <- err
		}
	}
	finish := func(err error) {
		for i := range reqs {
			if results[i] == nil {
				results[i] = err
			}
			reply(i, results[i])
		}
	}
	if !db.inTx {
		empty := len(db.replay) == 0
		for _, r := range reqs {
			empty = empty && r.fn == nil
		}
		if empty {
			finish(nil) // CommitBuffered after the buffered writes were committed
			return
		}
		if err := db.beginTx(mode != Deferred); err != nil {
			finish(err)
			return
		}
	}
	// A write alone in a transaction begun for it needs no savepoint: if it
	// fails, the whole transaction is rolled back with nothing else in it.
	alone := len(reqs) == 1 && len(db.carried) == 0
	ran := 0
	tx := &Tx{conn: db.writer}
	for i, r := range reqs {
		if r.fn == nil {
			continue
		}
		if err := r.ctx.Err(); err != nil {
			results[i] = err
			continue
		}
		ran++
		if alone {
			if err := r.fn(tx); err != nil {
				db.rollback()
				finish(db.classify(err))
				return
			}
		} else if err := db.inSavepoint(tx, r.fn); err != nil {
			if !errors.Is(err, errTxFailed) {
				results[i] = err
				continue
			}
			finish(err)
			return
		}
		if r.mode == Buffered {
			db.carried = append(db.carried, r.fn)
			// Marked before its caller is answered: a read the caller
			// makes next must find it to commit (CommitBuffered), or it
			// could read the file before this batch commits.
			db.buffered.Store(true)
			reply(i, nil) // it has run; the commit is not its caller's to wait for
		}
	}
	db.statsMu.Lock()
	db.stats.Writes += int64(ran)
	db.stats.MaxBatch = max(db.stats.MaxBatch, len(reqs))
	db.statsMu.Unlock()
	db.txWrites += ran
	if mode == Buffered && len(db.carried) > 0 && time.Since(db.openedAt) < db.opts.LingerDelay {
		db.buffered.Store(true)
		if !db.lingerArmed {
			db.lingerArmed = true
			db.linger.Reset(db.opts.LingerDelay)
		}
		finish(nil)
		return
	}
	writes, full := db.txWrites, db.txFull
	err := db.commit()
	if errors.Is(err, errNotSynced) {
		// Committed: only the writes that wait for fsync failed.
		for i, r := range reqs {
			if r.mode != Durable && results[i] == nil {
				reply(i, nil)
			}
		}
	}
	finish(err)
	if err == nil && db.opts.OnCommit != nil {
		db.opts.OnCommit(Commit{Writes: writes, Durable: full || db.opts.SyncNormal, Duration: time.Since(start)})
	}
}

// errNotSynced marks a commit whose fsync failed: the transaction is
// committed, but not known to be on disk.
var errNotSynced = errors.New("committed, but the fsync of the WAL failed, so a power failure may take it back")

// errTxFailed marks a failure that rolled back the whole transaction, not
// just one write's savepoint.
var errTxFailed = errors.New("transaction rolled back")

// inSavepoint runs fn in a savepoint of its own: if fn fails, only its
// changes are rolled back, and its error is returned. If the savepoint
// itself fails, the whole transaction is rolled back and the error wraps
// errTxFailed.
func (db *DB) inSavepoint(tx *Tx, fn func(*Tx) error) error {
	txFailed := func(err error) error {
		db.rollback()
		return fmt.Errorf("%w: %w", errTxFailed, db.classify(err))
	}
	if _, err := db.ctl.savepoint.ExecContext(batchCtx); err != nil {
		return txFailed(err)
	}
	ferr := fn(tx)
	if ferr != nil {
		if _, err := db.ctl.rollbackTo.ExecContext(batchCtx); err != nil {
			return txFailed(err)
		}
		db.rolledBack()
	}
	if _, err := db.ctl.release.ExecContext(batchCtx); err != nil {
		return txFailed(err)
	}
	return db.classify(ferr)
}

// beginTx begins the writer's transaction, then runs again the buffered
// writes that a failed commit rolled back, so that a failure elsewhere
// never undoes a buffered write while the process lives.
//
// Whether its commit waits for fsync is chosen here for the whole
// transaction (full): a transaction that may be left open for buffered
// writes is begun full, since the next write to join it may be durable.
// The writer runs at synchronous=NORMAL throughout, and a full commit
// fsyncs the WAL itself (see commit), rather than switching the connection
// to FULL and back with a PRAGMA for each transaction (SQLite compiles
// such a statement anew each time: two statements per operation).
func (db *DB) beginTx(full bool) error {
	if err := db.begin(); err != nil {
		return err
	}
	db.txFull = full && !db.opts.SyncNormal
	db.inTx, db.openedAt = true, time.Now()
	replay := db.replay
	db.replay = nil
	tx := &Tx{conn: db.writer, replay: true}
	for i, fn := range replay {
		if err := db.inSavepoint(tx, fn); err != nil {
			if errors.Is(err, errTxFailed) {
				db.replay = append(db.replay, replay[i+1:]...) // rollback kept the others
				return err
			}
			// Another process changed the record since: the write no
			// longer applies, and that process now answers for it.
			db.statsMu.Lock()
			db.stats.LostBuffered++
			db.statsMu.Unlock()
			continue
		}
		db.carried = append(db.carried, fn)
	}
	db.statsMu.Lock()
	db.stats.Replayed += int64(len(replay))
	db.statsMu.Unlock()
	return nil
}

// commit commits the open transaction, and waits for its fsync if it was
// begun full.
//
// A full commit is what SQLite's synchronous=FULL makes of it, in two
// steps: COMMIT at NORMAL writes the transaction's frames to the WAL
// (and, when the WAL starts over after a checkpoint, writes and fsyncs
// its new header first, as SQLite does at NORMAL), then syncWAL fsyncs
// the WAL file, which FULL would have done inside COMMIT. One difference:
// the transaction is visible to readers from COMMIT on, before its fsync,
// as a deferred one is. If that fsync fails, the transaction stays
// committed: the error says so, and the flusher tries the fsync again.
func (db *DB) commit() error {
	if _, err := db.ctl.commit.ExecContext(batchCtx); err != nil {
		db.rollback()
		return fmt.Errorf("commit: %w", db.classify(err))
	}
	full := db.txFull
	db.inTx, db.carried, db.lingerArmed, db.txWrites, db.txFull = false, nil, false, 0, false
	db.buffered.Store(len(db.replay) > 0)
	db.statsMu.Lock()
	if full || db.opts.SyncNormal {
		db.stats.DurableCommits++
	} else {
		db.stats.DeferredCommits++
	}
	db.statsMu.Unlock()
	var err error
	if full {
		if err = db.syncWAL(); err != nil {
			err = fmt.Errorf("idem %s %s: %w: %w", db.what, db.path, errNotSynced, err)
		}
	}
	if !db.opts.SyncNormal {
		db.unsyncedMu.Lock()
		if full && err == nil {
			// The fsync covered every commit before this one too.
			db.unsyncedSince = time.Time{}
		} else {
			if db.unsyncedSince.IsZero() {
				db.unsyncedSince = time.Now()
			}
			db.unsyncedN++
		}
		db.unsyncedMu.Unlock()
	}
	return err
}

// begin starts an immediate transaction, waiting up to BusyTimeout for
// another process's write lock. It polls every few hundred microseconds,
// with jitter, instead of using SQLite's busy handler, whose sleeps grow to
// 100 ms and let a process that writes back to back starve the others.
func (db *DB) begin() error {
	return db.whileBusy(func() error {
		_, err := db.ctl.begin.ExecContext(batchCtx)
		return err
	})
}

// whileBusy runs fn again while it fails with SQLITE_BUSY, for up to
// BusyTimeout, polling rather than sleeping in SQLite's busy handler (see
// begin). Its other failures are classified.
func (db *DB) whileBusy(fn func() error) error {
	deadline := time.Now().Add(db.opts.BusyTimeout)
	for {
		err := fn()
		if err == nil {
			return nil
		}
		if !isBusy(err) {
			return db.classify(err)
		}
		if time.Now().After(deadline) {
			return db.locked("the write lock", err)
		}
		time.Sleep(time.Duration(50+rand.IntN(250)) * time.Microsecond)
	}
}

// rollback rolls back the open transaction. The buffered writes it
// carried have returned to their callers; they are run again at the start
// of the next transaction, which the linger timer begins if no write does.
func (db *DB) rollback() {
	_, _ = db.ctl.rollback.ExecContext(batchCtx)
	db.inTx, db.lingerArmed, db.txWrites = false, false, 0
	if len(db.carried) > 0 {
		db.replay = append(db.replay, db.carried...)
		db.carried = nil
		db.buffered.Store(true)
		// Not at once: what failed the commit (a full disk) may last.
		db.linger.Reset(replayDelay)
	}
	db.rolledBack()
}

// replayDelay is how soon the linger timer retries buffered writes after
// the commit that carried them failed.
const replayDelay = 100 * time.Millisecond

func (db *DB) rolledBack() {
	if db.opts.OnRollback != nil {
		db.opts.OnRollback()
	}
}

// flushLoop makes deferred commits durable within FlushInterval, by
// syncing the WAL as a FULL commit would, unless a durable commit's fsync
// has done it first.
func (db *DB) flushLoop() {
	defer db.wg.Done()
	tick := time.NewTicker(min(db.opts.FlushInterval, 100*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-db.closing:
			return
		case <-tick.C:
			db.unsyncedMu.Lock()
			since, n, seen := db.unsyncedSince, db.unsyncedN, time.Now()
			db.unsyncedMu.Unlock()
			if since.IsZero() || seen.Sub(since) < db.opts.FlushInterval {
				continue
			}
			if db.flush() != nil {
				continue // tried again at the next tick
			}
			db.unsyncedMu.Lock()
			if db.unsyncedN == n {
				db.unsyncedSince = time.Time{}
			} else if !db.unsyncedSince.IsZero() && db.unsyncedSince.Before(seen) {
				// Commits made since it looked may have missed the
				// fsync; none of them is older than that look.
				db.unsyncedSince = seen
			}
			db.unsyncedMu.Unlock()
		}
	}
}

func (db *DB) flush() error {
	err := db.syncWAL()
	db.statsMu.Lock()
	db.stats.Flushes++
	db.statsMu.Unlock()
	return err
}

// syncWAL fsyncs the WAL file, through a descriptor kept open from its
// first call until Close: SQLite deletes the WAL only when the file's last
// connection closes, and the writer's stays open until Close, so the file
// this descriptor names is the WAL for as long as it is used. When there
// is no WAL yet there is nothing to sync. Closing it drops no lock that
// SQLite holds (see canReadWrite): SQLite takes its POSIX locks on the
// database file and the -shm only, and opens the -wal without locking
// (os_unix.c: noLock for every file but the main database). Its path is
// the database's with links resolved (see resolve), the WAL SQLite writes.
func (db *DB) syncWAL() error {
	db.walMu.Lock()
	defer db.walMu.Unlock()
	if db.wal == nil {
		f, err := os.Open(db.path + "-wal")
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return db.classify(err)
		}
		db.wal = f
	}
	db.walSyncs++
	return db.classify(db.wal.Sync())
}

// Sync commits the buffered writes with fsync and makes every deferred
// commit durable: after it returns, a power failure loses nothing written
// before it was called.
func (db *DB) Sync(ctx context.Context) error {
	if db.readOnly {
		return db.ErrIfClosed() // nothing was written through it
	}
	if err := db.Write(ctx, Durable, nil); err != nil {
		return err
	}
	return db.flush()
}

// truncateIfLarge runs between batches, by the leader, on the writer's
// connection.
// SQLite's auto-checkpoint (run by COMMIT every 1,000 pages) copies the WAL
// into the database and lets the next transaction write the WAL from its
// start again, so the WAL stays a few MB and its pages are overwritten
// rather than appended. But it never waits for readers, and the WAL starts
// over only when no reader is on it: readers back to back, each on a
// snapshot a little older than the last commit, hold that restart back for
// good, and the WAL grows by every commit (over 100 MiB for 8,000 Creates).
//
// So when the WAL has grown past WALLimit, a TRUNCATE checkpoint waits for
// the readers in the way, for up to checkpointWait: once it has copied the
// whole WAL into the database, new readers read the database alone, and it
// waits only for those still on the old WAL, whose reads are short. It polls
// (the writer has no busy handler; see begin). The writes queued meanwhile
// wait for it, which is why the wait is bounded; a reader that outlasts it
// (an open read transaction) makes the next tries come later and later, up
// to maxCheckpointBackoff apart, so that it cannot slow every write. The
// common case never gets here: without such readers the WAL stays near
// 4 MB. Running it here, rather than from another connection, means it
// never competes with the committer for the write lock.
func (db *DB) truncateIfLarge() {
	every := max(db.walCheckEvery, walCheckInterval)
	if time.Since(db.lastWALCheck) < every {
		return
	}
	db.lastWALCheck = time.Now()
	fi, err := os.Stat(db.path + "-wal")
	if err != nil || fi.Size() < db.opts.WALLimit {
		return
	}
	deadline := time.Now().Add(min(db.opts.BusyTimeout, checkpointWait))
	for {
		// The row is (busy, frames in the WAL, frames checkpointed): busy
		// is 1, not an error, when readers kept it from finishing.
		var busy, frames, done int
		err := db.writer.QueryRowContext(batchCtx, "PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busy, &frames, &done)
		if err == nil && busy == 0 {
			db.walCheckEvery = 0
			db.statsMu.Lock()
			db.stats.Checkpoints++
			db.statsMu.Unlock()
			return
		}
		if (err != nil && !isBusy(err)) || time.Now().After(deadline) {
			db.walCheckEvery = min(2*every, maxCheckpointBackoff)
			return
		}
		time.Sleep(time.Duration(50+rand.IntN(250)) * time.Microsecond)
	}
}

const (
	// walCheckInterval is how often the leader looks at the WAL's size.
	walCheckInterval = 100 * time.Millisecond
	// checkpointWait bounds how long a checkpoint that is due waits for
	// readers (and for BusyTimeout, if that is shorter).
	checkpointWait = 250 * time.Millisecond
	// maxCheckpointBackoff bounds how far apart the tries are while a
	// reader keeps the checkpoint from finishing.
	maxCheckpointBackoff = 5 * time.Second
)
