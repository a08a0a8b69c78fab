package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/journal"
)

// A write is Create, Update, Acquire or Release: what the group commit
// batches. Claim and Renew run on their own.
type writeOp uint8

const (
	opCreate writeOp = iota + 1
	opUpdate
	opAcquire
	opRelease
)

type writeReq struct {
	ctx context.Context
	op  writeOp
	key string
	// rec is the new record of a Create, the next record of an Update; ev
	// the creation event, or the Event that says why.
	rec   idem.Record
	ev    idem.Event
	owner string        // Acquire
	lease time.Duration // Acquire
	held  idem.Lease    // Release
	dur   idem.Durability

	// out is the write's result, shared with the batch's rows and this
	// journal's copies: the caller copies it once the batch is done, off
	// the goroutine that runs batches.
	out     idem.Record
	created bool
	err     error
	// again: the write runs again, alone, reading its row first: another
	// process created the same operation between this batch's read and its
	// write, or the batch wrote without reading (fastBatch) and found the
	// row changed, or the rules refused the write against this journal's
	// copy of the row, which must be checked against the row itself.
	again bool
	// sent is the row the write leaves if its transaction commits, once it
	// is queued: what a commit in doubt is read back against.
	sent *idem.Record
	// doubted is what an earlier run of the write sent, whose commit was
	// in doubt and read back as not committed. Behind a pooler the session
	// that ran it cannot be found and waited for (see settle): it may
	// still commit after the read-back, and the write run again then finds
	// its row. A row that is this record (its key, version, time and
	// state) is the earlier run's write, this write's result, not another
	// process's.
	doubted *idem.Record
	// copy is this journal's copy of the row an Update writes, set when
	// fastBatch runs it (see copiesFor); id the row a Create alone in
	// fastBatch inserted, 0 if it inserted none.
	copy rowCopy
	id   int64

	done chan struct{}
}

// write runs w through the group commit and returns its error. The first
// write to find no batch running commits the writes queued by then (its
// own) itself, on its own goroutine, and hands what was queued meanwhile
// to a goroutine (commit), which commits it at once, then every write
// queued meanwhile, and so on until none is left, with no goroutine to
// wake between two batches. At one caller, nothing is queued meanwhile: a
// write starts no goroutine, and waits for none to wake it. A writer that
// arrives during a batch waits
// for the next one, unless secondBatch writes are waiting by then: a second
// goroutine then commits them at once, on a connection of its own, while
// the first batch runs (see secondBatch), or the running batch is stuck
// (see watchBatches).
func (j *Journal) write(ctx context.Context, w *writeReq) error {
	done, err := j.enterWrite(ctx)
	if err != nil {
		return err
	}
	defer done()
	w.ctx, w.done = ctx, make(chan struct{})
	j.mu.Lock()
	j.queue = append(j.queue, w)
	start := j.running == 0 || (j.running < maxRunning && len(j.queue) >= secondBatch)
	if start {
		j.running++
	} else if !j.watching {
		j.watching = true
		j.watched.Add(1)
		go j.watchBatches()
	}
	j.mu.Unlock()
	if start {
		j.commit(true)
	}
	select {
	case <-w.done:
	case <-ctx.Done():
		// A write still queued is taken back, never sent: its caller gets
		// ctx's error, and nothing was written. One taken into a batch is
		// answered when the batch ends, which is by the soonest of its
		// callers' deadlines (see tryBatch): its outcome is then known,
		// or in doubt and read back, as for any write, never guessed at.
		j.mu.Lock()
		if i := slices.Index(j.queue, w); i >= 0 {
			j.queue = slices.Delete(j.queue, i, i+1)
			j.mu.Unlock()
			return ctx.Err()
		}
		j.mu.Unlock()
		<-w.done
	}
	return w.err
}

// Two batches at most run at once, and the second only while secondBatch
// writes or more are waiting for the first to end. A batch spends much of
// its time where the next one could run beside it: waiting for its
// commit's WAL flush, and, on a busy machine, for the one server process
// that runs it to be scheduled. With many writers, a second batch takes the
// writes that would wait for the first, and both commits share a flush.
// With few, nothing changes: at 16 callers, never more than 16 writes are
// in wait, and a batch commits all of them as before (0.25 commits per
// operation). Measured at 64 callers in one session (10 alternating
// rounds): 2.18x the naive journal with one batch at a time, 2.71x with
// this rule (0.073 and 0.077 commits per operation); 2.60x with a second
// batch from 16 waiting writes (0.103), 2.48x with three batches (0.127).
const (
	maxRunning  = 2
	secondBatch = 32
)

// commit runs batches of the oldest writes queued, up to maxBatch each,
// until the queue is empty. A second committer (see secondBatch) stops
// after a batch when the other is still running and fewer than secondBatch
// writes wait: those wait for the other, as one batch. A writer's own call
// (inline) runs one batch, and leaves the rest to a goroutine, which takes
// its place as a committer.
func (j *Journal) commit(inline bool) {
	for first := true; ; first = false {
		j.mu.Lock()
		if len(j.queue) == 0 || (!first && j.running > 1 && len(j.queue) < secondBatch) {
			j.running--
			if len(j.queue) == 0 {
				j.queue = nil
			}
			j.mu.Unlock()
			return
		}
		if inline && !first {
			j.mu.Unlock()
			go j.commit(false)
			return
		}
		n := min(len(j.queue), j.maxBatch)
		batch := slices.Clone(j.queue[:n])
		j.queue = j.queue[n:]
		j.batches++
		j.mu.Unlock()
		j.runBatch(batch)
	}
}

// runBatch commits reqs in one transaction, or, when that transaction
// fails as a whole, each on its own, and answers every caller.
//
// A write whose outcome is known is answered at once, not once the whole
// batch is done: the writes that run again alone (see commitAlone) may
// wait long, for a row lock another session holds, say, and no caller
// waits for another's. Those run in the order of their callers' deadlines,
// the soonest first, and those of callers without one last: each run
// alone ends by its own caller's deadline (tryBatch), so a caller with a
// deadline waits for no write but those whose deadlines come sooner.
func (j *Journal) runBatch(reqs []*writeReq) {
	live := reqs[:0:0]
	for _, r := range reqs {
		if err := r.ctx.Err(); err != nil {
			r.err = err
			close(r.done)
			continue
		}
		live = append(live, r)
	}
	if len(live) == 0 {
		return
	}
	err := j.commitBatch(live, true)
	if d := asDoubt(err); d != nil {
		if j.readBack(live, d) != notCommitted {
			err = nil
		}
		// Not committed: each write runs again, as after a batch that
		// failed as a whole.
	}
	if err != nil && len(live) == 1 && asDoubt(err) == nil {
		live[0].err = j.mapWriteError(live[0], err)
		err = nil
	}
	failed := err != nil
	rest := live[:0:0]
	for _, r := range live {
		switch {
		case failed && j.endedBefore(r, err):
			// A write whose caller's context ended is not run again
			// alone: answered now (the batch was cut at that deadline,
			// as likely as not; see tryBatch).
		case failed || r.again:
			rest = append(rest, r)
			continue
		}
		close(r.done)
	}
	if len(rest) > 1 {
		slices.SortStableFunc(rest, func(a, b *writeReq) int {
			da, db := reqDeadline(a), reqDeadline(b)
			switch {
			case da.IsZero() || db.IsZero():
				return cmp.Compare(boolInt(da.IsZero()), boolInt(db.IsZero()))
			}
			return da.Compare(db)
		})
	}
	for _, r := range rest {
		if failed {
			if j.endedBefore(r, err) {
				close(r.done)
				continue
			}
			j.commitAlone(r, true)
		}
		for try := 0; r.again && try < 3; try++ {
			if j.endedBefore(r, nil) {
				break
			}
			j.commitAlone(r, false)
		}
		if r.again {
			// Other transactions kept changing what this write depends on:
			// its result is not known, so it reports none.
			r.out, r.created = idem.Record{}, false
			r.err = fmt.Errorf("postgres: the write of %s met concurrent changes three times; try it again", r.key)
		}
		close(r.done)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// endedBefore answers r, when its caller's context has ended, with what
// is known of it, instead of running it again on a context already ended:
// a run of it that committed nothing, with the batch that failed (cause)
// or alone, and no other. Its error wraps the context's, and says what
// became of the write; a caller treats it as any failed write, whose
// outcome it does not take as known.
func (j *Journal) endedBefore(r *writeReq, cause error) bool {
	cerr := r.ctx.Err()
	if cerr == nil {
		return false
	}
	what := "nothing of it was committed"
	switch {
	case r.doubted != nil:
		// settle waited for the session that ran it, or canceled its wait
		// for a lock: not committed. Behind a pooler that session cannot
		// be found, and may commit it yet.
		what = "its commit's acknowledgement was lost and it read back as not committed (a session behind a pooler may commit it yet: read it again)"
	case r.op == opRelease && asDoubt(cause) != nil:
		what = "its commit's acknowledgement was lost, and a release cannot be read back: it may or may not be committed"
	}
	resetResult(r)
	r.again = false
	if cause != nil {
		what += fmt.Sprintf(" (%v)", cause)
	}
	r.err = fmt.Errorf("%s: %s: its caller's context ended (%w) before it could run again: %s",
		j.where(), r.describe(), cerr, what)
	return true
}

// wroteEarlier reports whether rec, the row as read, is what an earlier run
// of r, in doubt, sent (see doubted).
func (r *writeReq) wroteEarlier(rec idem.Record) bool {
	d := r.doubted
	// The lease too: another worker's write of the same version and
	// state in the same millisecond holds its own owner or epoch.
	return d != nil && rec.Key == d.Key && rec.Version == d.Version && rec.State == d.State &&
		wire.Millis(rec.UpdatedAt) == wire.Millis(d.UpdatedAt) &&
		rec.Lease.Owner == d.Lease.Owner && rec.Lease.Epoch == d.Lease.Epoch
}

func resetResult(r *writeReq) {
	r.out, r.created, r.err, r.again, r.sent, r.id = idem.Record{}, false, nil, false, nil, 0
}

// commitAlone runs r again in a transaction of its own and sets its
// result. A commit of its own in doubt is read back; one that did not
// commit is reported as such, not tried a third time.
func (j *Journal) commitAlone(r *writeReq, fast bool) {
	resetResult(r)
	err := j.commitBatch([]*writeReq{r}, fast)
	if d := asDoubt(err); d != nil {
		if j.readBack([]*writeReq{r}, d) != notCommitted {
			return
		}
		err = fmt.Errorf("%s: %s: its commit's acknowledgement was lost (%w), and it was not committed; try it again",
			j.where(), r.describe(), d.err)
	}
	if err != nil {
		r.err = j.mapWriteError(r, err)
	}
}

// mapWriteError turns a failed transaction into the caller's error: a key
// already used by another operation is idem.ErrDuplicateKey; any other
// failure names the journal and the write (a broken connection's bare
// "unexpected EOF" would name neither).
func (j *Journal) mapWriteError(r *writeReq, err error) error {
	if c, ok := isUniqueViolation(err); ok && r.op == opCreate && c == "operations_key_key" {
		return fmt.Errorf("%w: %s", idem.ErrDuplicateKey, r.key)
	}
	if errors.Is(err, idem.ErrJournalClosed) {
		return err
	}
	return fmt.Errorf("%s: %s: %w%s", j.where(), r.describe(), asReadOnly(err), timeoutAdvice(err))
}

type row struct {
	id      int64 // 0: created in this batch, not known yet
	rec     idem.Record
	written bool // by this batch
}

// tryBatch runs reqs in one transaction. It sets each request's outcome
// (including the rules' refusals, which fail only their caller) and
// returns an error only when the transaction failed as a whole. When fast
// is set and every write is a Create or an Update of a row this journal
// wrote last, the transaction takes one round trip (fastBatch); otherwise
// two (readBatch).
// commitBatch is tryBatch, reported to the OnCommit hook when it commits.
func (j *Journal) commitBatch(reqs []*writeReq, fast bool) error {
	if j.onCommit == nil {
		return j.tryBatch(reqs, fast)
	}
	start := time.Now()
	if err := j.tryBatch(reqs, fast); err != nil {
		return err
	}
	info := idem.CommitInfo{Duration: time.Since(start)}
	for _, r := range reqs {
		info.Durable = info.Durable || r.dur == idem.Durable
		if r.err == nil && !r.again {
			info.Writes++
		}
	}
	j.onCommit(info)
	return nil
}

// A batch that meets a session the server ended for idling, before the
// batch or in its transaction, runs again on another (see endedForTx):
// nothing of it committed.
//
// The batch runs on the shared bound (batchContext), with no timer of its
// own, unless a caller's context has a deadline that comes sooner
// (firstDeadline): it then ends at the soonest, so that a batch blocked
// (on a row lock another session holds, say) holds no caller past its
// deadline, whatever its batchmates' (a caller without one, the common
// case, included). A batch so cut fails as a whole (runBatch): its
// callers whose context ended are answered with what is known of their
// write (nothing committed, or read back as not committed, or committed),
// and the others' writes run again, each alone, a write blocked on its
// lock holding no one else's.
func (j *Journal) tryBatch(reqs []*writeReq, fast bool) error {
	ctx := batchContext(&j.bound)
	if end, ok := firstDeadline(reqs, reqDeadline, batchTimeout); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, end)
		defer cancel()
	}
	again := false
	return retryEnded(ctx, j.pool, endedForTx, func() error {
		if again {
			// What the rules set on the try the server ended is undone
			// with its transaction.
			for _, r := range reqs {
				resetResult(r)
			}
		}
		again = true
		return j.tryBatchOnce(ctx, reqs, fast)
	})
}

func reqDeadline(r *writeReq) time.Time {
	d, _ := r.ctx.Deadline()
	return d
}

func (j *Journal) tryBatchOnce(ctx context.Context, reqs []*writeReq, fast bool) error {
	conn, err := j.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	began := j.clock.local() // after its session began (see endAbandoned)
	if fast && j.copiesFor(reqs) {
		err = j.fastBatch(ctx, conn, reqs)
	} else {
		err = j.readBatch(ctx, conn, reqs)
	}
	j.endAbandoned(conn.Conn(), began, err)
	return err
}

// readBatch runs reqs in one transaction, in two round trips: the first
// begins it and reads and locks every row the writes touch, the second
// sends every change and the commit.
func (j *Journal) readBatch(ctx context.Context, conn *pgxpool.Conn, reqs []*writeReq) (err error) {

	durable := false
	var keys []string
	var ops [][2]string // (scope, op_id) of the creates
	for _, r := range reqs {
		durable = durable || r.dur == idem.Durable
		keys = append(keys, r.key)
		if r.op == opCreate {
			ops = append(ops, [2]string{r.rec.Scope, r.rec.ID})
		}
	}
	// In the order every batch locks rows in (see newQueries).
	slices.Sort(keys)
	keys = slices.Compact(keys)
	slices.SortFunc(ops, func(a, b [2]string) int { return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1])) })
	ops = slices.Compact(ops)
	scopes, ids := make([]string, len(ops)), make([]string, len(ops))
	for i, o := range ops {
		scopes[i], ids[i] = o[0], o[1]
	}

	// Round trip 1: begin, and read and lock what the writes touch.
	b := &pgx.Batch{}
	b.Queue(beginTx)
	// Outcomes only: committed before Update returns, flushed within
	// wal_writer_delay (see Journal). Anything else waits for the flush,
	// whatever the session's default.
	b.Queue(commitLevel(durable))
	byKey := map[string]*row{}
	byOp := map[[2]string]*row{}
	read := func(rows pgx.Rows) error {
		for rows.Next() {
			id, rec, err := scanRecord(rows)
			if err != nil {
				rows.Close()
				return err
			}
			rw := &row{id: id, rec: rec}
			byKey[rec.Key], byOp[[2]string{rec.Scope, rec.ID}] = rw, rw
		}
		return rows.Err()
	}
	b.Queue(j.q.lockByKeys, keys).Query(read)
	if len(scopes) > 0 {
		b.Queue(j.q.lockByOps, scopes, ids).Query(read)
	}
	open := false
	defer func() {
		if err != nil && open {
			_, _ = conn.Exec(context.Background(), "ROLLBACK")
		}
	}()
	open = true
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	if j.idleInTx != nil {
		j.idleInTx(conn.Conn().PgConn().PID())
	}

	// The rules, in Go, in arrival order: a later write of the batch sees
	// what an earlier one did.
	now := j.now()
	// Judged on this transaction's own connection: the pool may have no
	// other to give while it holds this one.
	gone := j.goneOn(ctx, conn, true)
	b = &pgx.Batch{}
	for _, r := range reqs {
		switch r.op {
		case opCreate:
			if ex := byOp[[2]string{r.rec.Scope, r.rec.ID}]; ex != nil {
				if ex.id == 0 {
					// Created by an earlier write of this very batch, whose
					// insert may yet find the operation created by another
					// transaction: judged again once this one commits.
					r.again = true
					continue
				}
				r.out = ex.rec
				if r.wroteEarlier(ex.rec) {
					r.created = true
					continue
				}
				if ex.rec.Fingerprint != r.rec.Fingerprint {
					r.err = journal.FingerprintMismatch(ex.rec)
				}
				continue
			}
			if ex := byKey[r.key]; ex != nil {
				if ex.id == 0 {
					r.again = true // the same: that insert may not happen
					continue
				}
				r.err = fmt.Errorf("%w: %s", idem.ErrDuplicateKey, r.key)
				continue
			}
			rw := &row{rec: r.rec}
			byKey[r.key], byOp[[2]string{r.rec.Scope, r.rec.ID}] = rw, rw
			r.out, r.created, r.sent = r.rec, true, &r.rec
			j.q.queueInsert(b, r.rec, r.ev).Exec(func(tag pgconn.CommandTag) error {
				if tag.RowsAffected() == 0 {
					r.again = true // created meanwhile by another process
				}
				return nil
			})
		case opUpdate, opAcquire, opRelease:
			rw := byKey[r.key]
			if rw == nil {
				r.err = journal.NotFound("key " + r.key)
				continue
			}
			if rw.id == 0 {
				// Created by this very batch: nothing can know it yet.
				r.again = true
				continue
			}
			if r.op != opRelease && r.wroteEarlier(rw.rec) {
				r.out = rw.rec
				continue
			}
			j.apply(b, r, rw, now, gone)
		}
	}
	// This journal's copies of the rows: forgotten, then taken from the
	// rows this batch wrote, whose xmin is this transaction's id.
	var xid int64
	written := false
	for _, rw := range byKey {
		written = written || rw.written
	}
	if written {
		b.Queue(`SELECT txid_current()`).QueryRow(func(row pgx.Row) error { return row.Scan(&xid) })
	}
	b.Queue("COMMIT")
	j.forget(keys)
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return doubtful(conn.Conn(), err)
	}
	open = false
	for _, rw := range byKey {
		if rw.written && rw.id != 0 {
			j.remember(rw.rec.Key, rowCopy{id: rw.id, xmin: uint32(xid), rec: rw.rec})
		}
	}
	return nil
}

// apply runs the rule of an Update, Acquire or Release against the row and
// queues its writes.
func (j *Journal) apply(b *pgx.Batch, r *writeReq, rw *row, now time.Time, gone func(string) bool) {
	switch r.op {
	case opUpdate:
		next, ev, err := journal.ApplyUpdate(rw.rec, r.rec, now, r.ev, gone)
		if err != nil {
			r.err = err
			return
		}
		j.q.queueStore(b, rw.id, rw.rec, next)
		j.q.queueEvent(b, rw.id, ev)
		rw.rec, rw.written, r.out, r.sent = next, true, next, &next
	case opAcquire:
		claimed, ev, err := journal.ApplyClaim(rw.rec, r.owner, r.lease, now, gone)
		if err != nil {
			r.out, r.err = rw.rec, err
			return
		}
		j.q.queueStore(b, rw.id, rw.rec, claimed)
		j.q.queueEvent(b, rw.id, ev)
		rw.rec, rw.written, r.out, r.sent = claimed, true, claimed, &claimed
	case opRelease:
		released, err := journal.ApplyRelease(rw.rec, r.held, now)
		if err != nil {
			r.err = err
			return
		}
		j.q.queueLease(b, rw.id, released)
		rw.rec, rw.written, r.out, r.sent = released, true, released, &released
	}
}

// rowCopy is this journal's copy of a row it wrote last: its id, the
// transaction that wrote it (the row's xmin, while nobody has changed it
// since), and the record as written.
type rowCopy struct {
	id   int64
	xmin uint32
	rec  idem.Record
}

// maxCopies bounds the copies kept: one per active operation this journal
// wrote last, which is at most the operations in flight in this process.
// Past it, an arbitrary copy is forgotten for each new one.
const maxCopies = 4096

// remember keeps c as the copy of key's row while the operation is active:
// a record that has left the active states is rarely written again.
func (j *Journal) remember(key string, c rowCopy) {
	j.copiesMu.Lock()
	defer j.copiesMu.Unlock()
	if !c.rec.State.Active() {
		delete(j.copies, key)
		return
	}
	if _, ok := j.copies[key]; !ok && len(j.copies) >= maxCopies {
		for k := range j.copies {
			delete(j.copies, k)
			break
		}
	}
	j.copies[key] = c
}

func (j *Journal) forget(keys []string) {
	j.copiesMu.Lock()
	defer j.copiesMu.Unlock()
	for _, k := range keys {
		delete(j.copies, k)
	}
}

// copiesFor sets the copy (see writeReq.copy) of each row reqs update, and
// reports whether fastBatch may run reqs: every write is a Create of a key
// this journal has no copy of, or an Update of a key it has one of, and no
// key or operation appears twice (the rules would then have to see one
// write's effect on the next, which readBatch does). A batch of one, every
// batch at one caller, makes no map.
func (j *Journal) copiesFor(reqs []*writeReq) bool {
	var seen map[string]bool // a batch of one needs none
	if len(reqs) > 1 {
		seen = make(map[string]bool, len(reqs))
	}
	var ops map[[2]string]bool
	j.copiesMu.Lock()
	defer j.copiesMu.Unlock()
	for _, r := range reqs {
		if seen[r.key] {
			return false
		}
		if seen != nil {
			seen[r.key] = true
		}
		c, ok := j.copies[r.key]
		switch r.op {
		case opCreate:
			op := [2]string{r.rec.Scope, r.rec.ID}
			if ok || ops[op] {
				return false
			}
			if len(reqs) == 1 {
				break
			}
			if ops == nil {
				ops = map[[2]string]bool{}
			}
			ops[op] = true
		case opUpdate:
			if !ok {
				return false
			}
			r.copy = c
		default:
			return false
		}
	}
	return true
}

// fastBatch runs reqs in one transaction and one round trip, without
// reading the rows first: every write is a Create or an Update of a row
// this journal wrote last and has a copy of (copiesFor). The rules run
// against the copies, and each update is written only if its row's xmin is
// still the transaction that wrote the copy, that is if no one has changed
// the row since (another process, a Renew, a Prune); otherwise it writes
// nothing and the write runs again through the read (again), as does a
// create that finds its operation or key taken, and an update the rules
// refuse against the copy. xmin is 32 bits and wraps after 2^32
// transactions, which no copy lives through; it is not unique across a
// fail-over to an asynchronous standby, or a crash that loses commits,
// after which the lost transactions' ids (and rows' ids) are handed out
// again: the update is therefore also fenced on the row's key and
// version, so that it never lands on another operation's row.
//
// The creates are one statement; each update is one statement, found by
// its primary key and sent in key order, the order readBatch locks rows in.
func (j *Journal) fastBatch(ctx context.Context, conn *pgxpool.Conn, reqs []*writeReq) (err error) {
	type update struct {
		r       *writeReq
		id      int64
		next    idem.Record
		ev      idem.Event
		written bool
	}
	durable := false
	var creates []*writeReq
	var updates []*update
	now := j.now()
	// Judged on the write's own connection, before its transaction begins:
	// the pool may have no other to give while the write holds this one.
	gone := j.goneOn(ctx, conn, false)
	for _, r := range reqs {
		durable = durable || r.dur == idem.Durable
		switch r.op {
		case opCreate:
			creates = append(creates, r)
		case opUpdate:
			next, ev, err := journal.ApplyUpdate(r.copy.rec, r.rec, now, r.ev, gone)
			if err != nil {
				r.again = true
				continue
			}
			updates = append(updates, &update{r: r, id: r.copy.id, next: next, ev: ev})
		}
	}
	if len(creates) == 0 && len(updates) == 0 {
		return nil
	}
	slices.SortFunc(creates, func(a, b *writeReq) int { return cmp.Compare(a.key, b.key) })
	slices.SortFunc(updates, func(a, b *update) int { return cmp.Compare(a.r.key, b.r.key) })

	// The transaction is the implicit one of the statements sent before
	// one Sync (PostgreSQL's extended protocol, pgx's batch), committed by
	// the server at the Sync unless a statement fails: no BEGIN, no COMMIT.
	// It runs at the session's default isolation, which a role or database
	// may make stronger than read committed; a statement that then meets a
	// concurrent write fails with a serialization failure instead of
	// writing nothing, and the writes run again through the read, which
	// begins its transaction at read committed. A write alone in its
	// transaction (at one caller, every write) is one statement, which
	// sets the commit level itself; a batch of more sets it in the
	// statement that asks for the transaction's id, last.
	lvl := levelOf(durable)
	alone := len(creates)+len(updates) == 1
	if !alone {
		lvl = levelNone
	}
	var stmts []stmt
	var ids map[string]int64 // of insertMany's rows; insertOne's in its request
	// xid is the transaction's id, returned by the statements that write
	// (see insertOne, storeFenced); set, it needs no statement of its own.
	var xid int64
	if len(creates) == 1 && len(updates) == 0 {
		r := creates[0]
		r.sent = &r.rec
		sql, args := j.q.insertOneStmt(r.rec, r.ev, lvl)
		stmts = append(stmts, stmt{sql, args, func(rows pgx.Rows) error {
			for rows.Next() {
				if err := rows.Scan(&r.id, &xid); err != nil {
					return err
				}
			}
			return rows.Err()
		}})
	} else if len(creates) > 0 {
		var cols createColumns
		for _, r := range creates {
			cols.add(r.rec, r.ev)
			r.sent = &r.rec
		}
		ids = make(map[string]int64, len(creates))
		sql, args := j.q.insertManyStmt(&cols)
		stmts = append(stmts, stmt{sql, args, func(rows pgx.Rows) error {
			for rows.Next() {
				var id int64
				var key string
				if err := rows.Scan(&id, &key); err != nil {
					return err
				}
				ids[key] = id
			}
			return rows.Err()
		}})
	}
	for _, u := range updates {
		u.r.sent = &u.next
		sql, args := j.q.storeFencedStmt(u.r.copy, u.next, u.ev, lvl)
		stmts = append(stmts, stmt{sql, args, func(rows pgx.Rows) error {
			for rows.Next() {
				if err := rows.Scan(&xid); err != nil {
					return err
				}
				u.written = true
			}
			return rows.Err()
		}})
	}
	if !alone {
		// A write that wrote nothing returns no id: asked once more, with
		// the commit level.
		stmts = append(stmts, stmt{`SELECT txid_current() FROM (` + commitLevel(durable) + `) AS lvl`, nil, func(rows pgx.Rows) error {
			for rows.Next() {
				if err := rows.Scan(&xid); err != nil {
					return err
				}
			}
			return rows.Err()
		}})
	}
	keys := make([]string, 0, len(updates))
	for _, u := range updates {
		keys = append(keys, u.r.key)
	}
	j.forget(keys)
	if err := runStmts(ctx, conn, stmts); err != nil {
		c, unique := isUniqueViolation(err)
		if isSerializationFailure(err) || (unique && c == "operations_key_key" && len(creates) == 1 && len(updates) == 0) {
			// Rolled back at the Sync (see above): nothing was written. A
			// create alone whose key was taken (insertOne's arbiter is the
			// operation, not its key) is judged through the read: another
			// operation's key, or this one's inserted meanwhile.
			for _, r := range reqs {
				r.again, r.sent = true, nil
			}
			return nil
		}
		return doubtful(conn.Conn(), err)
	}
	for _, r := range creates {
		id, ok := r.id, r.id != 0
		if ids != nil {
			id, ok = ids[r.key]
		}
		if !ok {
			r.again = true
			continue
		}
		r.out, r.created = r.rec, true
		j.remember(r.key, rowCopy{id: id, xmin: uint32(xid), rec: r.rec})
	}
	for _, u := range updates {
		if !u.written {
			u.r.again = true
			continue
		}
		u.r.out = u.next
		j.remember(u.r.key, rowCopy{id: u.id, xmin: uint32(xid), rec: u.next})
	}
	return nil
}

// stmt is a statement of a transaction, with its parameters and what reads
// its rows.
type stmt struct {
	sql  string
	args []any
	read func(pgx.Rows) error
}

// runStmts sends stmts, in one round trip, and reads their rows: one
// statement on its own (pgx's Query, without a batch's pipeline
// bookkeeping), more as a batch. The statements end with one Sync, and run
// in its implicit transaction when none is open.
func runStmts(ctx context.Context, conn *pgxpool.Conn, stmts []stmt) error {
	if len(stmts) == 1 {
		rows, err := conn.Query(ctx, stmts[0].sql, stmts[0].args...)
		if err != nil {
			return err
		}
		err = stmts[0].read(rows)
		rows.Close()
		return errors.Join(err, rows.Err())
	}
	b := &pgx.Batch{}
	for _, s := range stmts {
		b.Queue(s.sql, s.args...).Query(s.read)
	}
	return conn.SendBatch(ctx, b).Close()
}
