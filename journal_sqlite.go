package idem

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"iter"
	"strings"
	"time"

	"github.com/mattn/go-sqlite3"

	"github.com/idemkit/idem/internal/liveness"
	"github.com/idemkit/idem/internal/sqlitefile"
	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/journal"
)

// Errors from opening or using a journal file. They are reported as a
// *FileError naming the path and what to do, and match with errors.Is.
var (
	// ErrNotJournal: the file is not an idem journal: another program's
	// SQLite database, idem's server key store (the message says so), or
	// not SQLite at all.
	ErrNotJournal = sqlitefile.ErrForeign
	// ErrSchemaTooNew: the journal was written by a newer idem.
	ErrSchemaTooNew = sqlitefile.ErrSchemaTooNew
	// ErrJournalCorrupt: SQLite found the file damaged.
	ErrJournalCorrupt = sqlitefile.ErrCorrupt
	// ErrJournalPath: the path cannot hold a journal: a directory, a missing
	// directory, or no permission to write.
	ErrJournalPath = sqlitefile.ErrBadPath
	// ErrDiskFull: the file system is full; the failed write changed nothing.
	ErrDiskFull = sqlitefile.ErrFull
	// ErrSchemaTooOld: a journal opened with SQLiteReadOnly has an older
	// schema than this build's; opening it without SQLiteReadOnly migrates
	// it in place.
	ErrSchemaTooOld = sqlitefile.ErrSchemaTooOld
	// ErrJournalReadOnly: a write to a journal opened with SQLiteReadOnly.
	ErrJournalReadOnly = sqlitefile.ErrReadOnly
	// ErrJournalUnrecovered: a journal opened with SQLiteReadOnly has a hot
	// rollback journal beside it (path-journal), left by a process that
	// ended while it wrote the file (one killed while it created the
	// journal, say). Opening it without SQLiteReadOnly rolls that write back.
	ErrJournalUnrecovered = sqlitefile.ErrHot
	// ErrJournalLocked: another process held the journal's lock for longer
	// than the busy timeout (SQLiteBusyTimeout): an sqlite3 shell or a
	// backup tool left in a transaction, say. The failed call wrote nothing.
	ErrJournalLocked = sqlitefile.ErrLocked
	// ErrJournalHardLinks: the journal file has another name (a hard
	// link) than the path given. SQLite keeps the -wal and -shm beside the
	// name it opens, so processes using two names would not see each
	// other's commits; the message names the others found beside it.
	// Nothing was changed. A symbolic link to the file is fine.
	ErrJournalHardLinks = sqlitefile.ErrHardLinks
)

// FileError is a failure tied to a journal file: its path, the kind of
// failure (one of the Err values above), the cause and a hint.
type FileError = sqlitefile.Error

// SQLiteJournal is the embedded default Journal: one SQLite file in WAL mode.
// It is safe for concurrent use by many goroutines and by several processes
// on the same machine.
//
// # Durability
//
// By default every commit that records an intent (Create, Claim, Acquire,
// Update with Durable) returns only after the WAL that holds it has been
// fsynced (the file is opened with synchronous=FULL, read back; the
// committer then commits at NORMAL and fsyncs the WAL itself). A
// Deferred update returns once committed, before its fsync; it becomes
// durable with the next durable commit or within the flush interval (1 s
// by default). A Buffered update (a success recorded over in_flight)
// returns once it has run in the writer's open transaction, which is left
// open for the next write to join and commit, or committed within 1 ms;
// every read through this journal commits it first. If a crash loses it,
// the record reads in_flight again and resumes as a status check, which
// returns the same outcome: nothing is sent twice. So an operation's happy
// path costs one commit and one fsync: its outcome rides on the next
// operation's intent. A commit that fails (a full disk) does not lose the
// buffered writes it carried: they run again in the next transaction.
//
// # Group commit
//
// Writes that arrive together from many goroutines are committed in one
// transaction with one fsync, each in its own savepoint: every caller
// returns only after its own write is committed (and, if durable, on disk),
// waits at most for the batch in progress, and a write that fails fails
// only its caller.
//
// # Files
//
// The journal file is created with mode 0600, as are its -wal and -shm
// files. Reads use a pool of read-only connections and never block the
// writer. A checkpointer keeps the WAL bounded even under constant reads.
type SQLiteJournal struct {
	db      *sqlitefile.DB
	dict    *dict
	copies  *copies
	owners  *liveness.Dir
	maxBody int
	now     func() time.Time
}

var _ Journal = (*SQLiteJournal)(nil)

// An SQLiteOption configures OpenSQLite.
type SQLiteOption func(*sqliteConfig)

type sqliteConfig struct {
	file    sqlitefile.Options
	maxBody int
}

// SQLiteSynchronousNormal commits with synchronous=NORMAL instead of FULL:
// no write waits for fsync, and a power failure (not a process crash) may
// lose every write since the last checkpoint, including intents: a new
// journal may lose all it holds, its WAL never having been synced (the
// power-cut tests in powercut/ show both). An operation whose intent is lost
// is forgotten: if its request had already left, a retry gets a new key and
// may be applied twice. Use it only where throughput matters more than that
// guarantee.
func SQLiteSynchronousNormal() SQLiteOption {
	return func(c *sqliteConfig) { c.file.SyncNormal = true }
}

// SQLiteBusyTimeout sets how long a write waits for another process's lock
// before trying again. Defaults to 10 s.
func SQLiteBusyTimeout(d time.Duration) SQLiteOption {
	return func(c *sqliteConfig) { c.file.BusyTimeout = d }
}

// SQLiteMaxBodySize sets the largest request body the journal accepts.
// Defaults to DefaultMaxBodySize (1 MiB).
func SQLiteMaxBodySize(n int) SQLiteOption {
	return func(c *sqliteConfig) { c.maxBody = n }
}

// SQLiteFlushInterval bounds how long a deferred write may wait for its
// fsync when no durable write comes along. Defaults to 1 s.
func SQLiteFlushInterval(d time.Duration) SQLiteOption {
	return func(c *sqliteConfig) { c.file.FlushInterval = d }
}

// SQLiteMustExist makes OpenSQLite fail, with an error matching
// ErrJournalPath and fs.ErrNotExist, instead of creating a missing journal:
// for tools that only inspect one.
func SQLiteMustExist() SQLiteOption {
	return func(c *sqliteConfig) { c.file.MustExist = true }
}

// SQLiteReadOnly opens an existing journal for reading only, for tools that
// inspect a journal without changing it: nothing is created, migrated or
// locked for writing, and no lock file of a gone client is swept. Every
// write (Create, Update, Claim, Register, Prune...) fails with
// ErrJournalReadOnly. A journal of an older schema is refused with
// ErrSchemaTooOld, a missing or empty file as with SQLiteMustExist.
//
// Neither file is changed when a process ended while it wrote the journal
// in rollback-journal mode (as it does while creating it) and left a hot
// rollback journal beside it: where SQLite would play that back, rewriting
// or truncating the file, a read-only open fails with
// ErrJournalUnrecovered, at once or at a later read; an open without
// SQLiteReadOnly (idem migrate, an application) rolls it back. A rollback
// journal that SQLite does not take for hot (another process is writing)
// is left alone and the file read as it was before that write.
func SQLiteReadOnly() SQLiteOption {
	return func(c *sqliteConfig) { c.file.ReadOnly, c.file.MustExist = true, true }
}

// SQLiteMaxBatch sets the most writes committed in one transaction by
// group commit. 1 commits every write on its own (a Buffered write too, at
// once), which is slower under concurrency and exists for comparison.
// Defaults to 256.
func SQLiteMaxBatch(n int) SQLiteOption {
	return func(c *sqliteConfig) { c.file.MaxBatch = n }
}

// SQLiteWALLimit sets the WAL size at which the journal truncates the WAL,
// waiting for readers if it must. Defaults to 64 MiB.
func SQLiteWALLimit(n int64) SQLiteOption {
	return func(c *sqliteConfig) { c.file.WALLimit = n }
}

// SQLiteOnCommit calls fn after each transaction the journal commits, on
// the committer's goroutine (keep it fast): how many writes it carried,
// whether it waited for fsync, and how long its writers waited at most.
// The otel module's metrics of commit latency and operations per commit
// come from it.
func SQLiteOnCommit(fn func(CommitInfo)) SQLiteOption {
	return func(c *sqliteConfig) {
		if fn == nil {
			c.file.OnCommit = nil
			return
		}
		c.file.OnCommit = func(cm sqlitefile.Commit) {
			fn(CommitInfo{Writes: cm.Writes, Durable: cm.Durable, Duration: cm.Duration})
		}
	}
}

// OpenSQLite opens the journal file at path, creating it (mode 0600) if it
// does not exist and migrating its schema if it is older than this build's.
// It refuses, with a *FileError that names the path and what to do and
// without changing the file: a directory, a missing or unwritable directory,
// a file that is not an idem journal (ErrNotJournal), a journal written by a
// newer idem (ErrSchemaTooNew), a damaged file (ErrJournalCorrupt), and a
// file with another name, a hard link (ErrJournalHardLinks).
// A path that is a symbolic link is resolved once, here (see Path); one
// whose target does not exist yet creates that target, mode 0600.
// A new file is built under a temporary name (.idem-new-*) in its
// directory, then put at its path: the directory must be readable and
// writable. A creator killed meanwhile leaves that name behind; nothing
// removes it (no open can tell a dead creator's file from a live one's),
// and it is not counted as a second name of the file.
func OpenSQLite(path string, opts ...SQLiteOption) (*SQLiteJournal, error) {
	cfg := sqliteConfig{maxBody: DefaultMaxBodySize}
	for _, o := range opts {
		o(&cfg)
	}
	cfg.file.What = "journal"
	cfg.file.AppID = journalAppID
	cfg.file.Migrations = journalSchema
	cfg.file.Closed = ErrJournalClosed
	d, cp := &dict{}, &copies{}
	cfg.file.OnRollback = func() { d.forget(); cp.forget() }
	db, err := sqlitefile.Open(context.Background(), path, cfg.file)
	if err != nil {
		return nil, err
	}
	j := &SQLiteJournal{db: db, dict: d, copies: cp, owners: liveness.New(db.Path() + "-owners"),
		maxBody: cfg.maxBody, now: time.Now}
	if cfg.file.ReadOnly {
		return j, nil
	}
	// Processes that ended without anyone needing their leases leave their
	// lock files behind; forget those no active record refers to.
	_ = j.owners.Sweep(func(owner string) bool { return j.holdsLeases(context.Background(), owner) })
	return j, nil
}

// Path returns the journal file's absolute path, with symbolic links
// resolved: the file SQLite writes, beside which its -wal, -shm and -owners
// are, whichever link each process sharing it was given.
func (j *SQLiteJournal) Path() string { return j.db.Path() }

// SQLiteStats counts what the journal's committer did since it was opened.
type SQLiteStats struct {
	// Writes is the number of writes committed or refused.
	Writes int64
	// DurableCommits and DeferredCommits count transactions committed with
	// and without waiting for fsync; Writes/(DurableCommits+DeferredCommits)
	// is the average batch.
	DurableCommits, DeferredCommits int64
	// MaxBatch is the most writes seen in one transaction.
	MaxBatch int
	// Flushes counts WAL fsyncs made for deferred writes.
	Flushes int64
	// Checkpoints counts WAL checkpoints.
	Checkpoints int64
	// Replayed counts buffered writes run again because the commit that
	// carried them failed (a full disk, say); LostBuffered those that no
	// longer applied then, because another process had changed the record,
	// which now answers for it.
	Replayed, LostBuffered int64
}

// Stats returns the committer's counters.
func (j *SQLiteJournal) Stats() SQLiteStats {
	s := j.db.Stats()
	return SQLiteStats{Writes: s.Writes, DurableCommits: s.DurableCommits, DeferredCommits: s.DeferredCommits,
		MaxBatch: s.MaxBatch, Flushes: s.Flushes, Checkpoints: s.Checkpoints,
		Replayed: s.Replayed, LostBuffered: s.LostBuffered}
}

// Close makes every deferred write durable and closes the file. It fsyncs
// the WAL whether or not its checkpoint can run (another process's read
// transaction stops it short), and returns an error if that fsync fails:
// then a power failure may take back the deferred writes.
func (j *SQLiteJournal) Close() error { return j.db.Close() }

// MaxBodySize is the largest request body the journal accepts
// (SQLiteMaxBodySize): Client.RoundTripper reads no more of a body.
func (j *SQLiteJournal) MaxBodySize() int { return j.maxBody }

// Create implements Journal.
func (j *SQLiteJournal) Create(ctx context.Context, rec Record) (Record, bool, error) {
	// The record is built (and copied from rec) before the write joins the
	// committer, which every write waits for, one batch at a time.
	nr, _, err := journal.NewRecord(rec, j.now(), j.maxBody)
	if err != nil {
		return Record{}, false, err
	}
	var out Record
	var created bool
	err = j.db.Write(ctx, sqlitefile.Durable, func(tx *sqlitefile.Tx) error {
		id, err := j.dict.insertRecord(tx, nr)
		if err != nil {
			var se sqlite3.Error
			if errors.As(err, &se) && se.ExtendedCode == sqlite3.ErrConstraintUnique {
				return fmt.Errorf("%w: %s", ErrDuplicateKey, nr.Key)
			}
			return err
		}
		if id == 0 {
			// The operation exists: return it, unless it is another request.
			if _, out, err = scanRecord(tx.QueryRow(selectRecord+` WHERE o.scope = ? AND o.op_id = ?`, rec.Scope, rec.ID)); err != nil {
				return err
			}
			if out.Fingerprint != rec.Fingerprint {
				return journal.FingerprintMismatch(out)
			}
			return nil
		}
		// The creation event is not written: it is derived from the row for
		// as long as the row is at its first version (History), and written
		// by the write that moves the row past it (storeRecordIf), in that
		// write's transaction. One b-tree leaf fewer per intent's commit.
		created = true
		j.copies.put(id, nr)
		return nil
	})
	if err != nil && !errors.Is(err, ErrFingerprintMismatch) {
		return Record{}, false, err
	}
	if created {
		out = journal.CloneRecord(nr) // nr is the copies' now
	}
	return out, created, err
}

// Get implements Journal.
func (j *SQLiteJournal) Get(ctx context.Context, key string) (Record, error) {
	return j.readOne(ctx, "key "+key, selectRecord+` WHERE o.key = ?`, keyValue(key))
}

// Lookup implements Journal.
func (j *SQLiteJournal) Lookup(ctx context.Context, scope, id string) (Record, error) {
	return j.readOne(ctx, scope+"/"+id, selectRecord+` WHERE o.scope = ? AND o.op_id = ?`, scope, id)
}

func (j *SQLiteJournal) readOne(ctx context.Context, what, query string, args ...any) (Record, error) {
	if err := j.beforeRead(ctx); err != nil {
		return Record{}, err
	}
	_, rec, err := scanRecord(j.db.Reader.QueryRowContext(ctx, query, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return Record{}, journal.NotFound(what)
	}
	return rec, j.db.Classify(err)
}

// fileMode is the commit mode that gives durability d.
func fileMode(d Durability) sqlitefile.Mode {
	switch d {
	case Deferred:
		return sqlitefile.Deferred
	case Buffered:
		return sqlitefile.Buffered
	}
	return sqlitefile.Durable
}

// beforeRead refuses reads after Close and commits buffered writes, which
// the read connections would not see otherwise. A read goes on if that
// commit fails (a full disk, say): it sees the journal as last committed,
// and the buffered writes stay pending.
func (j *SQLiteJournal) beforeRead(ctx context.Context) error {
	if err := j.db.ErrIfClosed(); err != nil {
		return err
	}
	if err := j.db.CommitBuffered(ctx); ctx.Err() != nil {
		return err
	}
	return nil
}

// Update implements Journal.
func (j *SQLiteJournal) Update(ctx context.Context, rec Record, d Durability, why Event) (Record, error) {
	if err := journal.CheckDurability(d); err != nil {
		return Record{}, err
	}
	var out Record
	err := j.db.Write(ctx, fileMode(d), func(tx *sqlitefile.Tx) error {
		now := j.now()
		if c, ok := j.copies.get(rec.Key); ok && c.rec.Version == rec.Version {
			// Judged against the copy; written only if the row still is it.
			next, ev, err := journal.ApplyUpdate(c.rec, rec, now, why, j.owners.Gone)
			if err == nil {
				wrote, err := j.updateFromCopy(tx, c.id, c.rec, next, ev)
				if err != nil {
					return err
				}
				if wrote {
					j.copies.put(c.id, next)
					if !tx.Replay() {
						out = next
					}
					return nil
				}
			}
			j.copies.drop(rec.Key) // stale, or refused: read the row
		}
		id, stored, err := j.lockedGet(tx, rec.Key)
		if err != nil {
			return err
		}
		next, ev, err := journal.ApplyUpdate(stored, rec, now, why, j.owners.Gone)
		if err != nil {
			return err
		}
		if _, err := j.dict.storeUpdate(tx, id, stored, next, ev, ""); err != nil {
			return err
		}
		j.copies.put(id, next)
		if !tx.Replay() { // a replayed write's caller has its answer
			out = next
		}
		return nil
	})
	if err == nil && out.State.Active() {
		out = journal.CloneRecord(out) // kept by the copies: the caller gets its own
	}
	return out, err
}

// lockedGet reads a record inside a write transaction.
func (j *SQLiteJournal) lockedGet(tx *sqlitefile.Tx, key string) (int64, Record, error) {
	id, rec, err := scanRecord(tx.QueryRow(selectRecord+` WHERE o.key = ?`, keyValue(key)))
	if errors.Is(err, sql.ErrNoRows) {
		return 0, Record{}, journal.NotFound("key " + key)
	}
	return id, rec, err
}

// Claim implements Journal.
func (j *SQLiteJournal) Claim(ctx context.Context, req ClaimRequest) ([]Record, error) {
	if err := journal.CheckClaimRequest(req); err != nil {
		return nil, err
	}
	var out []Record
	err := j.db.Write(ctx, sqlitefile.Durable, func(tx *sqlitefile.Tx) error {
		out = out[:0]
		now := j.now()
		due := now
		if !req.DueBy.IsZero() && req.DueBy.Before(now) {
			due = req.DueBy
		}
		// Free operations first: while they fill the claim, the owners of
		// live leases need not be looked at, which means reading every due
		// operation (the index does not cover leases). Only a claim that
		// free operations do not fill looks for gone owners and takes
		// their operations too.
		ids, recs, err := j.claimable(tx, req, due, now, "")
		if err != nil {
			return err
		}
		if len(recs) < req.Limit {
			gone, err := j.goneOwners(tx, due, now)
			if err != nil {
				return err
			}
			if gone != "" {
				if ids, recs, err = j.claimable(tx, req, due, now, gone); err != nil {
					return err
				}
			}
		}
		for i, rec := range recs {
			claimed, ev, err := journal.ApplyClaim(rec, req.Owner, req.Lease, now, j.owners.Gone)
			if err != nil {
				return err
			}
			if err := j.dict.storeRecord(tx, ids[i], rec, claimed); err != nil {
				return err
			}
			if err := j.dict.insertEvent(tx, ids[i], ev); err != nil {
				return err
			}
			out = append(out, claimed)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// claimable reads up to req.Limit due operations of req's scope and URL
// prefix whose lease is free, or held by one of the owners in gone (a
// condition from goneOwners), oldest due first. Each active state is read
// on its own, in the order of the (state, next_attempt_at) index, and the
// three lists merged: a single query over "state IN (1, 2, 3)" ordered by
// due time sorts every due operation to return the first, which made a
// Resume of n operations cost n² (its claims take one or a few at a time).
func (j *SQLiteJournal) claimable(tx *sqlitefile.Tx, req ClaimRequest, due, now time.Time, gone string) ([]int64, []Record, error) {
	cond := `o.next_attempt_at <= ? AND (o.lease_owner IS NULL OR o.lease_expires_at <= ?` + gone + `)`
	args := []any{wire.Millis(due), wire.Millis(now)}
	if req.Scope != "" {
		cond += ` AND o.scope = ?`
		args = append(args, req.Scope)
	}
	if req.URLPrefix != "" {
		cond += ` AND substr(o.url, 1, length(?)) = ?`
		args = append(args, req.URLPrefix, req.URLPrefix)
	}
	args = append(args, req.Limit)
	var parts []string
	var all []any
	for _, state := range []State{StatePending, StateInFlight, StateUnknown} {
		parts = append(parts, fmt.Sprintf(`SELECT * FROM (SELECT o.id FROM operations o WHERE o.state = %d AND %s
			ORDER BY o.next_attempt_at, o.id LIMIT ?)`, state, cond))
		all = append(all, args...)
	}
	q := selectRecord + ` WHERE o.id IN (` + strings.Join(parts, " UNION ALL ") + `) ORDER BY o.next_attempt_at, o.id LIMIT ?`
	rows, err := tx.Query(q, append(all, req.Limit)...)
	if err != nil {
		return nil, nil, err
	}
	var ids []int64
	var recs []Record
	for rows.Next() {
		id, rec, err := scanRecord(rows)
		if err != nil {
			rows.Close()
			return nil, nil, err
		}
		ids, recs = append(ids, id), append(recs, rec)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, nil, err
	}
	return ids, recs, nil
}

// goneOwners returns the SQL condition that admits records leased by an
// owner known to be gone: " OR o.lease_owner IN (…)" with their dict
// numbers, or "" when no owner of a due, live lease is gone.
func (j *SQLiteJournal) goneOwners(tx *sqlitefile.Tx, due, now time.Time) (string, error) {
	rows, err := tx.Query(`SELECT DISTINCT o.lease_owner, d.value FROM operations o JOIN dict d ON d.id = o.lease_owner
		WHERE o.state IN (1, 2, 3) AND o.next_attempt_at <= ? AND o.lease_expires_at > ?`, wire.Millis(due), wire.Millis(now))
	if err != nil {
		return "", err
	}
	var ids []string
	for rows.Next() {
		var id int64
		var owner []byte
		if err := rows.Scan(&id, &owner); err != nil {
			rows.Close()
			return "", err
		}
		if j.owners.Gone(string(owner)) {
			ids = append(ids, fmt.Sprint(id))
		}
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil || len(ids) == 0 {
		return "", err
	}
	return " OR o.lease_owner IN (" + strings.Join(ids, ", ") + ")", nil
}

// Acquire implements Journal.
func (j *SQLiteJournal) Acquire(ctx context.Context, key, owner string, lease time.Duration) (Record, error) {
	var out Record
	err := j.db.Write(ctx, sqlitefile.Durable, func(tx *sqlitefile.Tx) error {
		id, stored, err := j.lockedGet(tx, key)
		if err != nil {
			return err
		}
		claimed, ev, err := journal.ApplyClaim(stored, owner, lease, j.now(), j.owners.Gone)
		if err != nil {
			out = stored
			return err
		}
		out = claimed
		if err := j.dict.storeRecord(tx, id, stored, claimed); err != nil {
			return err
		}
		j.copies.put(id, claimed)
		return j.dict.insertEvent(tx, id, ev)
	})
	if err == nil {
		out = journal.CloneRecord(out) // kept by the copies: the caller gets its own
	}
	return out, err
}

// Renew implements Journal.
func (j *SQLiteJournal) Renew(ctx context.Context, held map[string]Lease, lease time.Duration) (int, error) {
	var n int64
	err := j.db.Write(ctx, sqlitefile.Deferred, func(tx *sqlitefile.Tx) error {
		n = 0
		now := j.now()
		for key, l := range held {
			res, err := tx.Exec(`UPDATE operations SET lease_expires_at = max(lease_expires_at, ?)
				WHERE key = ? AND lease_epoch = ? AND state IN (1, 2, 3)
				AND lease_owner = (SELECT id FROM dict WHERE value = ?)`,
				wire.Millis(journal.TruncateTime(now.Add(lease))), keyValue(key), l.Epoch, []byte(l.Owner))
			if err != nil {
				return err
			}
			m, err := res.RowsAffected()
			if err != nil {
				return err
			}
			n += m
		}
		return nil
	})
	return int(n), err
}

// Register implements Journal. Every process that shares the file is on
// this machine, so liveness is exact: the owner holds an advisory lock on a
// file of its own in the directory beside the journal (path + "-owners",
// mode 0700) for as long as it is registered, and the kernel drops the
// lock when the process ends, however it ends.
func (j *SQLiteJournal) Register(ctx context.Context, owner string) (func() error, error) {
	if owner == "" {
		return nil, fmt.Errorf("%w: Register needs an owner name", ErrInvalidRecord)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := j.db.ErrIfClosed(); err != nil {
		return nil, err
	}
	if j.db.ReadOnly() {
		return nil, &FileError{What: "journal", Path: j.Path(), Kind: ErrJournalReadOnly}
	}
	release, err := j.owners.Register(owner)
	if errors.Is(err, liveness.ErrRegistered) {
		return nil, fmt.Errorf("%w: owner %q registered before; each registration needs a new name", ErrInvalidRecord, owner)
	}
	if err != nil {
		return nil, &FileError{What: "journal", Path: j.owners.Path(), Kind: ErrJournalPath, Err: err,
			Hint: "the directory beside the journal must be writable; it holds one lock file per live client"}
	}
	return func() error {
		err := release()
		if !j.holdsLeases(context.Background(), owner) {
			j.owners.Forget(owner)
		}
		return err
	}, nil
}

// holdsLeases reports whether an active record is leased by owner (live or
// lapsed), so that owner's being gone still matters. It answers true when
// it cannot tell.
func (j *SQLiteJournal) holdsLeases(ctx context.Context, owner string) bool {
	var one int
	err := j.db.Reader.QueryRowContext(ctx, `SELECT 1 FROM operations INDEXED BY operations_due
		WHERE state IN (1, 2, 3) AND lease_owner = (SELECT id FROM dict WHERE value = ?) LIMIT 1`,
		[]byte(owner)).Scan(&one)
	return !errors.Is(err, sql.ErrNoRows)
}

// Sync implements Journal.
func (j *SQLiteJournal) Sync(ctx context.Context) error { return j.db.Sync(ctx) }

// Release implements Journal. A lost release only delays the next claim
// until the lease expires, so it is buffered.
func (j *SQLiteJournal) Release(ctx context.Context, key string, l Lease) error {
	return j.db.Write(ctx, sqlitefile.Buffered, func(tx *sqlitefile.Tx) error {
		id, stored, err := j.lockedGet(tx, key)
		if err != nil {
			return err
		}
		released, err := journal.ApplyRelease(stored, l, j.now())
		if err != nil {
			return err
		}
		return j.dict.storeRecord(tx, id, stored, released)
	})
}

// listPage is how many records List reads per query. Each page is its own
// short read, so a slow consumer never pins a snapshot (and the WAL).
const listPage = 256

// List implements Journal.
func (j *SQLiteJournal) List(ctx context.Context, f Filter) iter.Seq2[Record, error] {
	return func(yield func(Record, error) bool) {
		var where []string
		var args []any
		if f.Scope != "" {
			where, args = append(where, "o.scope = ?"), append(args, f.Scope)
		}
		if len(f.States) > 0 {
			marks := strings.Repeat(", ?", len(f.States))[2:]
			where = append(where, "o.state IN ("+marks+")")
			for _, s := range f.States {
				args = append(args, s)
			}
		}
		if !f.CreatedBefore.IsZero() {
			where, args = append(where, "o.created_at < ?"), append(args, wire.Millis(f.CreatedBefore))
		}
		q := selectRecord + ` WHERE o.id > ?`
		for _, w := range where {
			q += " AND " + w
		}
		q += ` ORDER BY o.id LIMIT ` + fmt.Sprint(listPage)
		var after int64
		if f.After != "" {
			var err error
			if after, err = j.rowID(ctx, f.After); err != nil {
				yield(Record{}, err)
				return
			}
		}
		for {
			page, last, err := j.listPage(ctx, q, append([]any{after}, args...))
			if err != nil {
				yield(Record{}, err)
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
// key: its row id.
func (j *SQLiteJournal) rowID(ctx context.Context, key string) (int64, error) {
	if err := j.beforeRead(ctx); err != nil {
		return 0, err
	}
	var id int64
	err := j.db.Reader.QueryRowContext(ctx, `SELECT id FROM operations WHERE key = ?`, keyValue(key)).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, journal.CursorNotFound(key)
	}
	return id, j.db.Classify(err)
}

func (j *SQLiteJournal) listPage(ctx context.Context, q string, args []any) ([]Record, int64, error) {
	if err := j.beforeRead(ctx); err != nil {
		return nil, 0, err
	}
	rows, err := j.db.Reader.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, 0, j.db.Classify(err)
	}
	defer rows.Close()
	var page []Record
	var id int64
	for rows.Next() {
		var rec Record
		var err error
		id, rec, err = scanRecord(rows)
		if err != nil {
			return nil, 0, j.db.Classify(err)
		}
		page = append(page, rec)
	}
	return page, id, j.db.Classify(rows.Err())
}

// Count implements Journal.
func (j *SQLiteJournal) Count(ctx context.Context) ([]Count, error) {
	if err := j.beforeRead(ctx); err != nil {
		return nil, err
	}
	rows, err := j.db.Reader.QueryContext(ctx,
		`SELECT scope, state, count(*), min(created_at) FROM operations GROUP BY scope, state ORDER BY scope, state`)
	if err != nil {
		return nil, j.db.Classify(err)
	}
	defer rows.Close()
	var out []Count
	for rows.Next() {
		var c Count
		var oldest int64
		if err := rows.Scan(&c.Scope, &c.State, &c.N, &oldest); err != nil {
			return nil, j.db.Classify(err)
		}
		c.Oldest = wire.FromMillis(oldest)
		out = append(out, c)
	}
	return out, j.db.Classify(rows.Err())
}

// History implements Journal.
func (j *SQLiteJournal) History(ctx context.Context, key string) ([]Event, error) {
	if err := j.beforeRead(ctx); err != nil {
		return nil, err
	}
	rows, err := j.db.Reader.QueryContext(ctx, `SELECT e.version, e.at, e.from_state, e.to_state, e.attempt,
		e.status, e.error, w.value, e.why
		FROM operations o LEFT JOIN events e ON e.op = o.id LEFT JOIN dict w ON w.id = e.owner
		WHERE o.key = ? ORDER BY e.version`, keyValue(key))
	if err != nil {
		return nil, j.db.Classify(err)
	}
	defer rows.Close()
	found := false
	var out []Event
	for rows.Next() {
		found = true
		var version, at, from, to, attempt, status sql.NullInt64
		var msg, owner sql.NullString
		var why any
		if err := rows.Scan(&version, &at, &from, &to, &attempt, &status, &msg, &owner, &why); err != nil {
			return nil, j.db.Classify(err)
		}
		if !version.Valid {
			continue // a record without events: cannot happen, but reads as empty
		}
		ev := Event{Version: version.Int64, At: wire.FromMillis(at.Int64), From: State(from.Int64), To: State(to.Int64),
			Attempt: int(attempt.Int64), StatusCode: int(status.Int64), Error: msg.String, Owner: owner.String}
		unpackWhy(&ev, why)
		out = append(out, ev)
	}
	if err := rows.Err(); err != nil {
		return nil, j.db.Classify(err)
	}
	if !found {
		return nil, journal.NotFound("key " + key)
	}
	if len(out) == 0 {
		// A record at its first version: its creation event is not
		// written (Create), but derived from the record. A record settled
		// by its first update may have both its events derived
		// (storeUpdate), from the row and the settler it keeps.
		var keeper sql.NullString
		_, rec, err := scanRecord(j.db.Reader.QueryRowContext(ctx, selectRecord+` WHERE o.key = ?`, keyValue(key)))
		if err == nil && rec.Version == 2 {
			err = j.db.Reader.QueryRowContext(ctx, `SELECT (SELECT value FROM dict WHERE id = o.lease_owner)
				FROM operations o WHERE o.key = ?`, keyValue(key)).Scan(&keeper)
		}
		if err != nil {
			return nil, j.db.Classify(err)
		}
		if rec.Version == 1 {
			out = append(out, journal.CreationEvent(rec))
		} else if h, ok := derivedHistory(rec, keeper.String); ok {
			out = append(out, h[:]...)
		}
	}
	return out, nil
}

// pruneChunk is how many records Prune deletes per transaction, so that a
// large prune never holds the writer for long.
const pruneChunk = 500

// Prune implements Journal. Deleting is deferred: records that come back
// after a power failure are pruned again next time.
func (j *SQLiteJournal) Prune(ctx context.Context, before time.Time) (int, error) {
	total := 0
	var after int64
	for {
		var n int
		err := j.db.Write(ctx, sqlitefile.Deferred, func(tx *sqlitefile.Tx) error {
			rows, err := tx.Query(`SELECT id FROM operations WHERE id > ? AND state IN (4, 5, 7) AND updated_at < ?
				ORDER BY id LIMIT ?`, after, wire.Millis(before), pruneChunk)
			if err != nil {
				return err
			}
			var ids []any
			for rows.Next() {
				var id int64
				if err := rows.Scan(&id); err != nil {
					rows.Close()
					return err
				}
				ids = append(ids, id)
			}
			if err := errors.Join(rows.Err(), rows.Close()); err != nil {
				return err
			}
			if len(ids) == 0 {
				return nil
			}
			marks := strings.Repeat(", ?", len(ids))[2:]
			if _, err := tx.Exec(`DELETE FROM events WHERE op IN (`+marks+`)`, ids...); err != nil {
				return err
			}
			if _, err := tx.Exec(`DELETE FROM operations WHERE id IN (`+marks+`)`, ids...); err != nil {
				return err
			}
			n, after = len(ids), ids[len(ids)-1].(int64)
			return nil
		})
		total += n
		if err != nil {
			return total, err
		}
		if n < pruneChunk {
			return total, nil
		}
	}
}

// importRecords stores n finished records, made by gen with their history,
// in one transaction, through the same statements as Create and Update: for
// benchmarks that need a journal of a million records without a million
// commits.
func (j *SQLiteJournal) importRecords(ctx context.Context, n int, gen func(i int) (Record, []Event, error)) error {
	return j.db.Write(ctx, sqlitefile.Durable, func(tx *sqlitefile.Tx) error {
		for i := range n {
			rec, history, err := gen(i)
			if err != nil {
				return err
			}
			created := rec
			created.Response = nil
			id, err := j.dict.insertRecord(tx, created)
			if err != nil {
				return err
			}
			// The history first: storeRecord adds a derived creation event
			// only when none is there.
			for _, ev := range history {
				if err := j.dict.insertEvent(tx, id, ev); err != nil {
					return err
				}
			}
			if err := j.dict.storeRecord(tx, id, created, rec); err != nil {
				return err
			}
		}
		return nil
	})
}
