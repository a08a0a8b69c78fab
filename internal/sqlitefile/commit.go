package sqlitefile

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"time"
)

// Tx runs a write's statements on the writer connection, inside the batch's
// transaction and the write's own savepoint.
type Tx struct {
	conn *sql.Conn
}

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

type writeReq struct {
	ctx     context.Context
	durable bool
	fn      func(*Tx) error
	done    chan error    // the write's result
	lead    chan struct{} // the lead is passed to this write
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
}

// Stats returns the counters so far.
func (db *DB) Stats() Stats {
	db.statsMu.Lock()
	defer db.statsMu.Unlock()
	return db.stats
}

// Write runs fn in a write transaction and returns its error, or the
// commit's. Writes that arrive together from many goroutines share one
// transaction and one fsync (group commit); each runs in its own savepoint,
// so a write that fails is rolled back alone and fails only its caller.
//
// The group commit needs no goroutine of its own: the first writer to find
// no commit in progress leads, commits every write queued by then (its own
// first), and hands the lead to the oldest write still queued, if any, before
// returning. A lone writer thus commits on its own goroutine, with no
// hand-off, and a writer that arrives during a commit waits for that one
// commit only, then joins the next.
//
// A durable write returns after its transaction is on disk. A deferred
// write returns after its transaction is committed without waiting for
// fsync; it becomes durable with the next durable commit or within
// FlushInterval, whichever comes first.
//
// Once queued, Write waits for the commit even if ctx is canceled, so that
// it never reports a failure for a write that was committed; a write whose
// ctx is canceled before its turn is skipped.
func (db *DB) Write(ctx context.Context, durable bool, fn func(*Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	req := &writeReq{ctx: ctx, durable: durable, fn: fn, done: make(chan error, 1), lead: make(chan struct{}, 1)}
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

// lead commits the writes at the head of the queue (the leader's own among
// them), then passes the lead on or gives it up.
func (db *DB) lead() {
	db.queueMu.Lock()
	n := min(len(db.queue), db.opts.MaxBatch)
	batch := append(db.batch[:0], db.queue[:n]...)
	db.queue = db.queue[n:]
	db.queueMu.Unlock()

	db.runBatch(batch)
	db.truncateIfLarge()
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

// runBatch commits the deferred writes first, without fsync, so that they
// do not wait behind the durable ones' fsync; then the durable writes.
func (db *DB) runBatch(batch []*writeReq) {
	var deferred, durable []*writeReq
	for _, r := range batch {
		if r.durable || db.opts.SyncNormal {
			durable = append(durable, r)
		} else {
			deferred = append(deferred, r)
		}
	}
	if len(deferred) > 0 {
		db.commitGroup(deferred, false)
	}
	if len(durable) > 0 {
		db.commitGroup(durable, true)
	}
}

func (db *DB) commitGroup(reqs []*writeReq, durable bool) {
	results := make([]error, len(reqs))
	finish := func(err error) {
		for i, r := range reqs {
			if results[i] == nil {
				results[i] = err
			}
			r.done <- results[i]
		}
	}
	// The synchronous level is a property of the connection, read at each
	// commit: FULL makes COMMIT fsync the WAL, which also makes every
	// earlier deferred commit durable; NORMAL does not fsync.
	wantFull := durable && !db.opts.SyncNormal
	if wantFull != db.syncFull {
		// Not a prepared statement: SQLite applies this pragma when it
		// compiles it, so a prepared one would change nothing when run again.
		level := "NORMAL"
		if wantFull {
			level = "FULL"
		}
		if _, err := db.writer.ExecContext(batchCtx, "PRAGMA synchronous="+level); err != nil {
			finish(db.classify(err))
			return
		}
		db.syncFull = wantFull
	}
	if err := db.begin(); err != nil {
		finish(err)
		return
	}
	tx := &Tx{conn: db.writer}
	ran := 0
	if len(reqs) == 1 {
		// Alone in its transaction, a write needs no savepoint: if it
		// fails, the whole transaction is rolled back.
		if err := reqs[0].ctx.Err(); err != nil {
			db.rollback()
			finish(err)
			return
		}
		if err := reqs[0].fn(tx); err != nil {
			db.rollback()
			finish(db.classify(err))
			return
		}
		ran = 1
	}
	for i, r := range reqs {
		if len(reqs) == 1 {
			break
		}
		if err := r.ctx.Err(); err != nil {
			results[i] = err
			continue
		}
		if _, err := db.ctl.savepoint.ExecContext(batchCtx); err != nil {
			db.rollback()
			finish(db.classify(err))
			return
		}
		ran++
		if err := r.fn(tx); err != nil {
			results[i] = db.classify(err)
			if _, rerr := db.ctl.rollbackTo.ExecContext(batchCtx); rerr != nil {
				db.rollback()
				finish(db.classify(rerr))
				return
			}
			db.rolledBack()
		}
		if _, err := db.ctl.release.ExecContext(batchCtx); err != nil {
			db.rollback()
			finish(db.classify(err))
			return
		}
	}
	if _, err := db.ctl.commit.ExecContext(batchCtx); err != nil {
		db.rollback()
		finish(fmt.Errorf("commit: %w", db.classify(err)))
		return
	}
	db.statsMu.Lock()
	db.stats.Writes += int64(ran)
	if durable {
		db.stats.DurableCommits++
	} else {
		db.stats.DeferredCommits++
	}
	db.stats.MaxBatch = max(db.stats.MaxBatch, len(reqs))
	db.statsMu.Unlock()
	if !durable {
		select {
		case db.dirty <- struct{}{}:
		default:
		}
	}
	finish(nil)
}

// begin starts an immediate transaction, waiting up to BusyTimeout for
// another process's write lock. It polls every few hundred microseconds,
// with jitter, instead of using SQLite's busy handler, whose sleeps grow to
// 100 ms and let a process that writes back to back starve the others.
func (db *DB) begin() error {
	deadline := time.Now().Add(db.opts.BusyTimeout)
	for {
		_, err := db.ctl.begin.ExecContext(batchCtx)
		if err == nil {
			return nil
		}
		if !isBusy(err) {
			return db.classify(err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("idem %s %s: another process has held the write lock for over %s: %w",
				db.what, db.path, db.opts.BusyTimeout, err)
		}
		time.Sleep(time.Duration(50+rand.IntN(250)) * time.Microsecond)
	}
}

func (db *DB) rollback() {
	_, _ = db.ctl.rollback.ExecContext(batchCtx)
	db.rolledBack()
}

func (db *DB) rolledBack() {
	if db.opts.OnRollback != nil {
		db.opts.OnRollback()
	}
}

// flushLoop makes deferred commits durable within FlushInterval, by
// syncing the WAL as a FULL commit would.
func (db *DB) flushLoop() {
	defer db.wg.Done()
	tick := time.NewTicker(min(db.opts.FlushInterval, 100*time.Millisecond))
	defer tick.Stop()
	var dirtySince time.Time
	for {
		select {
		case <-db.closing:
			return
		case <-db.dirty:
			if dirtySince.IsZero() {
				dirtySince = time.Now()
			}
		case <-tick.C:
			if !dirtySince.IsZero() && time.Since(dirtySince) >= db.opts.FlushInterval {
				db.flush()
				dirtySince = time.Time{}
			}
		}
	}
}

func (db *DB) flush() {
	f, err := os.Open(db.path + "-wal")
	if err != nil {
		return // no WAL: a checkpoint already moved everything and synced
	}
	_ = f.Sync()
	_ = f.Close()
	db.statsMu.Lock()
	db.stats.Flushes++
	db.statsMu.Unlock()
}

// truncateIfLarge runs between batches, by the leader, on the writer's
// connection.
// SQLite's auto-checkpoint (run by COMMIT every 1,000 pages) copies the WAL
// into the database and lets the next transaction write the WAL from its
// start again, so the WAL stays a few MB and its pages are overwritten
// rather than appended. A reader that keeps an old snapshot can hold that
// restart back; when the WAL has grown past WALLimit nonetheless, a
// TRUNCATE checkpoint resets it. It does not wait for readers (the writer
// has no busy timeout): if one is in the way it is tried again after the
// next batches. Running it here, rather than from another connection,
// means it never competes with the committer for the write lock.
func (db *DB) truncateIfLarge() {
	if time.Since(db.lastWALCheck) < 100*time.Millisecond {
		return
	}
	db.lastWALCheck = time.Now()
	fi, err := os.Stat(db.path + "-wal")
	if err != nil || fi.Size() < db.opts.WALLimit {
		return
	}
	if _, err := db.writer.ExecContext(batchCtx, "PRAGMA wal_checkpoint(TRUNCATE)"); err == nil {
		db.statsMu.Lock()
		db.stats.Checkpoints++
		db.statsMu.Unlock()
	}
}
