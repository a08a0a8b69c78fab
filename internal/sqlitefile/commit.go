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
	done    chan error
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
// A durable write returns after its transaction is on disk. A deferred
// write returns after its transaction is committed without waiting for
// fsync; it becomes durable with the next durable commit or within
// FlushInterval, whichever comes first.
//
// Once fn has been handed to the committer, Write waits for the commit even
// if ctx is canceled, so that it never reports a failure for a write that
// was committed; a write whose ctx is canceled before its turn is skipped.
func (db *DB) Write(ctx context.Context, durable bool, fn func(*Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	req := &writeReq{ctx: ctx, durable: durable, fn: fn, done: make(chan error, 1)}
	// The read lock keeps Close from stopping the committer between the
	// check and the send, which would leave req unanswered.
	db.closeMu.RLock()
	if db.closed {
		db.closeMu.RUnlock()
		return db.ErrIfClosed()
	}
	select {
	case db.writes <- req:
	case <-ctx.Done():
		db.closeMu.RUnlock()
		return ctx.Err()
	}
	db.closeMu.RUnlock()
	return <-req.done
}

func (db *DB) commitLoop() {
	defer db.wg.Done()
	syncFull := !db.opts.SyncNormal
	batch := make([]*writeReq, 0, db.opts.MaxBatch)
	for {
		select {
		case req := <-db.writes:
			batch = append(batch[:0], req)
		case <-db.closing:
			// Commit what was accepted before Close, then stop: Write
			// accepts nothing once closing is closed.
			for {
				select {
				case req := <-db.writes:
					db.runBatch([]*writeReq{req}, &syncFull)
				default:
					return
				}
			}
		}
	gather:
		for len(batch) < db.opts.MaxBatch {
			select {
			case req := <-db.writes:
				batch = append(batch, req)
			default:
				break gather
			}
		}
		db.runBatch(batch, &syncFull)
	}
}

// runBatch commits the deferred writes first, without fsync, so that they
// do not wait behind the durable ones' fsync; then the durable writes.
func (db *DB) runBatch(batch []*writeReq, syncFull *bool) {
	var deferred, durable []*writeReq
	for _, r := range batch {
		if r.durable || db.opts.SyncNormal {
			durable = append(durable, r)
		} else {
			deferred = append(deferred, r)
		}
	}
	if len(deferred) > 0 {
		db.commitGroup(deferred, false, syncFull)
	}
	if len(durable) > 0 {
		db.commitGroup(durable, true, syncFull)
	}
}

func (db *DB) commitGroup(reqs []*writeReq, durable bool, syncFull *bool) {
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
	if wantFull != *syncFull {
		level := "NORMAL"
		if wantFull {
			level = "FULL"
		}
		if _, err := db.writer.ExecContext(batchCtx, "PRAGMA synchronous="+level); err != nil {
			finish(db.classify(err))
			return
		}
		*syncFull = wantFull
	}
	if err := db.begin(); err != nil {
		finish(err)
		return
	}
	tx := &Tx{conn: db.writer}
	ran := 0
	for i, r := range reqs {
		if err := r.ctx.Err(); err != nil {
			results[i] = err
			continue
		}
		if _, err := tx.Exec("SAVEPOINT w"); err != nil {
			db.rollback()
			finish(db.classify(err))
			return
		}
		ran++
		if err := r.fn(tx); err != nil {
			results[i] = db.classify(err)
			if _, rerr := tx.Exec("ROLLBACK TO w"); rerr != nil {
				db.rollback()
				finish(db.classify(rerr))
				return
			}
		}
		if _, err := tx.Exec("RELEASE w"); err != nil {
			db.rollback()
			finish(db.classify(err))
			return
		}
	}
	if _, err := tx.Exec("COMMIT"); err != nil {
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
		_, err := db.writer.ExecContext(batchCtx, "BEGIN IMMEDIATE")
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
	_, _ = db.writer.ExecContext(batchCtx, "ROLLBACK")
}

// checkpointLoop keeps the WAL bounded and makes deferred commits durable.
// It runs on its own connection so that copying the WAL into the database
// never holds up a batch.
func (db *DB) checkpointLoop() {
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
			db.checkpointIfLarge()
			if !dirtySince.IsZero() && time.Since(dirtySince) >= db.opts.FlushInterval {
				db.flush()
				dirtySince = time.Time{}
			}
		}
	}
}

// flush makes deferred commits durable by syncing the WAL, as a FULL commit
// would have.
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

// passiveCheckpointAt is the WAL size at which a checkpoint is run without
// waiting for anyone: SQLite's own auto-checkpoint threshold of 1,000 pages.
const passiveCheckpointAt = 1000 * 4096

func (db *DB) checkpointIfLarge() {
	fi, err := os.Stat(db.path + "-wal")
	if err != nil {
		return
	}
	// PASSIVE never waits. When readers keep it from finishing and the WAL
	// keeps growing, TRUNCATE waits for them (through the busy handler) and
	// resets the WAL to zero bytes.
	var mode string
	switch {
	case fi.Size() >= db.opts.WALLimit:
		mode = "TRUNCATE"
	case fi.Size() >= passiveCheckpointAt:
		mode = "PASSIVE"
	default:
		return
	}
	if _, err := db.ckptDB.ExecContext(batchCtx, "PRAGMA wal_checkpoint("+mode+")"); err != nil && !isBusy(err) {
		return
	}
	db.statsMu.Lock()
	db.stats.Checkpoints++
	db.statsMu.Unlock()
}
