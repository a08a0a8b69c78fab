package idem

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"strings"
	"time"

	"github.com/mattn/go-sqlite3"

	"github.com/idemkit/idem/internal/sqlitefile"
)

// Errors from opening or using a journal file. They are reported as a
// *FileError naming the path and what to do, and match with errors.Is.
var (
	// ErrNotJournal: the file is not an idem journal: another program's
	// SQLite database, or not SQLite at all.
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
)

// FileError is a failure tied to a journal file: its path, the kind of
// failure (one of the Err values above), the cause and a hint.
type FileError = sqlitefile.Error

// journalAppID marks a file as an idem journal ("idmj").
const journalAppID = 0x69646d6a

// journalSchema[i] migrates the journal schema from version i to i+1.
var journalSchema = []string{
	`CREATE TABLE operations (
		id               INTEGER PRIMARY KEY,
		key              TEXT NOT NULL UNIQUE,
		scope            TEXT NOT NULL,
		op_id            TEXT NOT NULL,
		method           TEXT NOT NULL,
		url              TEXT NOT NULL,
		header           BLOB,
		body             BLOB,
		fingerprint      TEXT NOT NULL,
		state            INTEGER NOT NULL,
		attempts         INTEGER NOT NULL,
		next_attempt_at  INTEGER NOT NULL,
		lease_owner      TEXT,
		lease_epoch      INTEGER NOT NULL,
		lease_expires_at INTEGER,
		resp_status      INTEGER,
		resp_header      BLOB,
		resp_body        BLOB,
		resp_replayed    INTEGER,
		last_error       TEXT,
		note             TEXT,
		created_at       INTEGER NOT NULL,
		updated_at       INTEGER NOT NULL,
		expires_at       INTEGER,
		version          INTEGER NOT NULL,
		UNIQUE (scope, op_id)
	);
	-- Claim and Renew only ever look at active records, which are few.
	CREATE INDEX operations_due ON operations (next_attempt_at) WHERE state IN (1, 2, 3);
	CREATE INDEX operations_owner ON operations (lease_owner) WHERE state IN (1, 2, 3);
	CREATE TABLE events (
		op         INTEGER NOT NULL,
		version    INTEGER NOT NULL,
		at         INTEGER NOT NULL,
		from_state INTEGER,
		to_state   INTEGER NOT NULL,
		attempt    INTEGER NOT NULL,
		status     INTEGER,
		error      TEXT,
		owner      TEXT,
		PRIMARY KEY (op, version)
	) WITHOUT ROWID;`,
}

// SQLiteJournal is the embedded default Journal: one SQLite file in WAL mode.
// It is safe for concurrent use by many goroutines and by several processes
// on the same machine.
//
// # Durability
//
// By default every commit that records an intent (Create, Claim, Acquire,
// Update with Durable) returns only after SQLite has fsynced it
// (synchronous=FULL; the setting is read back when the file is opened). A
// Deferred update (an outcome recorded over in_flight) returns once
// committed, before its fsync; it becomes durable with the next durable
// commit or within the flush interval (1 s by default). If a power failure
// loses it, the record reads in_flight again and resumes as a status check,
// which returns the same outcome: nothing is sent twice. So an operation's
// happy path costs one fsync.
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
// lose the last writes, including intents. An operation whose intent is lost
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

// SQLiteMaxBatch sets the most writes committed in one transaction by
// group commit. 1 commits every write on its own, which is slower under
// concurrency and exists for comparison. Defaults to 256.
func SQLiteMaxBatch(n int) SQLiteOption {
	return func(c *sqliteConfig) { c.file.MaxBatch = n }
}

// SQLiteWALLimit sets the WAL size at which the journal truncates the WAL,
// waiting for readers if it must. Defaults to 64 MiB.
func SQLiteWALLimit(n int64) SQLiteOption {
	return func(c *sqliteConfig) { c.file.WALLimit = n }
}

// OpenSQLite opens the journal file at path, creating it (mode 0600) if it
// does not exist and migrating its schema if it is older than this build's.
// It refuses, with a *FileError that names the path and what to do and
// without changing the file: a directory, a missing or unwritable directory,
// a file that is not an idem journal (ErrNotJournal), a journal written by a
// newer idem (ErrSchemaTooNew), and a damaged file (ErrJournalCorrupt).
func OpenSQLite(path string, opts ...SQLiteOption) (*SQLiteJournal, error) {
	cfg := sqliteConfig{maxBody: DefaultMaxBodySize}
	for _, o := range opts {
		o(&cfg)
	}
	cfg.file.What = "journal"
	cfg.file.AppID = journalAppID
	cfg.file.Migrations = journalSchema
	cfg.file.Closed = ErrJournalClosed
	db, err := sqlitefile.Open(context.Background(), path, cfg.file)
	if err != nil {
		return nil, err
	}
	return &SQLiteJournal{db: db, maxBody: cfg.maxBody, now: time.Now}, nil
}

// Path returns the journal file's absolute path.
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
}

// Stats returns the committer's counters.
func (j *SQLiteJournal) Stats() SQLiteStats {
	s := j.db.Stats()
	return SQLiteStats{Writes: s.Writes, DurableCommits: s.DurableCommits, DeferredCommits: s.DeferredCommits,
		MaxBatch: s.MaxBatch, Flushes: s.Flushes, Checkpoints: s.Checkpoints}
}

// Close makes every deferred write durable and closes the file.
func (j *SQLiteJournal) Close() error { return j.db.Close() }

const recordColumns = `key, scope, op_id, method, url, header, body, fingerprint, state, attempts,
	next_attempt_at, lease_owner, lease_epoch, lease_expires_at, resp_status, resp_header, resp_body,
	resp_replayed, last_error, note, created_at, updated_at, expires_at, version`

// Create implements Journal.
func (j *SQLiteJournal) Create(ctx context.Context, rec Record) (Record, bool, error) {
	var out Record
	var created bool
	err := j.db.Write(ctx, true, func(tx *sqlitefile.Tx) error {
		existing, err := scanRecord(tx.QueryRow(`SELECT `+recordColumns+` FROM operations WHERE scope = ? AND op_id = ?`, rec.Scope, rec.ID))
		switch {
		case err == nil:
			out = existing
			if existing.Fingerprint != rec.Fingerprint {
				return fingerprintMismatch(existing)
			}
			return nil
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		nr, ev, err := NewRecord(rec, j.now(), j.maxBody)
		if err != nil {
			return err
		}
		res, err := tx.Exec(`INSERT INTO operations (`+recordColumns+`)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, recordArgs(nr)...)
		if err != nil {
			var se sqlite3.Error
			if errors.As(err, &se) && se.ExtendedCode == sqlite3.ErrConstraintUnique {
				return fmt.Errorf("%w: %s", ErrDuplicateKey, nr.Key)
			}
			return err
		}
		id, err := res.LastInsertId()
		if err != nil {
			return err
		}
		if err := insertEvent(tx, id, ev); err != nil {
			return err
		}
		out, created = nr, true
		return nil
	})
	if err != nil && !errors.Is(err, ErrFingerprintMismatch) {
		return Record{}, false, err
	}
	return out, created, err
}

// Get implements Journal.
func (j *SQLiteJournal) Get(ctx context.Context, key string) (Record, error) {
	return j.readOne(ctx, "key "+key, `SELECT `+recordColumns+` FROM operations WHERE key = ?`, key)
}

// Lookup implements Journal.
func (j *SQLiteJournal) Lookup(ctx context.Context, scope, id string) (Record, error) {
	return j.readOne(ctx, scope+"/"+id, `SELECT `+recordColumns+` FROM operations WHERE scope = ? AND op_id = ?`, scope, id)
}

func (j *SQLiteJournal) readOne(ctx context.Context, what, query string, args ...any) (Record, error) {
	if err := j.db.ErrIfClosed(); err != nil {
		return Record{}, err
	}
	rec, err := scanRecord(j.db.Reader.QueryRowContext(ctx, query, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return Record{}, notFound(what)
	}
	return rec, j.db.Classify(err)
}

// Update implements Journal.
func (j *SQLiteJournal) Update(ctx context.Context, rec Record, d Durability) (Record, error) {
	var out Record
	err := j.db.Write(ctx, d == Durable, func(tx *sqlitefile.Tx) error {
		id, stored, err := j.lockedGet(tx, rec.Key)
		if err != nil {
			return err
		}
		next, ev, err := ApplyUpdate(stored, rec, j.now())
		if err != nil {
			return err
		}
		if err := storeRecord(tx, id, next); err != nil {
			return err
		}
		out = next
		return insertEvent(tx, id, ev)
	})
	return out, err
}

// lockedGet reads a record inside a write transaction.
func (j *SQLiteJournal) lockedGet(tx *sqlitefile.Tx, key string) (int64, Record, error) {
	var id int64
	rec, err := scanRecord(tx.QueryRow(`SELECT id, `+recordColumns+` FROM operations WHERE key = ?`, key), &id)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, Record{}, notFound("key " + key)
	}
	return id, rec, err
}

func storeRecord(tx *sqlitefile.Tx, id int64, r Record) error {
	var status, replayed any
	var respHeader, respBody []byte
	if r.Response != nil {
		status, replayed = r.Response.StatusCode, r.Response.Replayed
		respHeader, respBody = encodeHeader(r.Response.Header), nonNil(r.Response.Body)
	}
	_, err := tx.Exec(`UPDATE operations SET state = ?, attempts = ?, next_attempt_at = ?,
		lease_owner = ?, lease_epoch = ?, lease_expires_at = ?, resp_status = ?, resp_header = ?,
		resp_body = ?, resp_replayed = ?, last_error = ?, note = ?, updated_at = ?, expires_at = ?, version = ?
		WHERE id = ?`,
		r.State, r.Attempts, millis(r.NextAttemptAt), nullString(r.Lease.Owner), r.Lease.Epoch,
		nullMillis(r.Lease.ExpiresAt), status, respHeader, respBody, replayed, nullString(r.LastError),
		nullString(r.Note), millis(r.UpdatedAt), nullMillis(r.ExpiresAt), r.Version, id)
	return err
}

func insertEvent(tx *sqlitefile.Tx, id int64, ev Event) error {
	var from any
	if ev.From != 0 {
		from = ev.From
	}
	var status any
	if ev.StatusCode != 0 {
		status = ev.StatusCode
	}
	_, err := tx.Exec(`INSERT INTO events (op, version, at, from_state, to_state, attempt, status, error, owner)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		id, ev.Version, millis(ev.At), from, ev.To, ev.Attempt, status, nullString(ev.Error), nullString(ev.Owner))
	return err
}

// Claim implements Journal.
func (j *SQLiteJournal) Claim(ctx context.Context, req ClaimRequest) ([]Record, error) {
	if err := checkClaimRequest(req); err != nil {
		return nil, err
	}
	var out []Record
	err := j.db.Write(ctx, true, func(tx *sqlitefile.Tx) error {
		out = out[:0]
		now := j.now()
		q := `SELECT id, ` + recordColumns + ` FROM operations
			WHERE state IN (1, 2, 3) AND next_attempt_at <= ?
			AND (lease_owner IS NULL OR lease_expires_at <= ?)`
		args := []any{millis(now), millis(now)}
		if req.Scope != "" {
			q += ` AND scope = ?`
			args = append(args, req.Scope)
		}
		if req.URLPrefix != "" {
			q += ` AND substr(url, 1, length(?)) = ?`
			args = append(args, req.URLPrefix, req.URLPrefix)
		}
		q += ` ORDER BY next_attempt_at, id LIMIT ?`
		args = append(args, req.Limit)
		rows, err := tx.Query(q, args...)
		if err != nil {
			return err
		}
		var ids []int64
		var recs []Record
		for rows.Next() {
			var id int64
			rec, err := scanRecord(rows, &id)
			if err != nil {
				rows.Close()
				return err
			}
			ids, recs = append(ids, id), append(recs, rec)
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return err
		}
		for i, rec := range recs {
			claimed, err := ApplyClaim(rec, req.Owner, req.Lease, now)
			if err != nil {
				return err
			}
			if err := storeRecord(tx, ids[i], claimed); err != nil {
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

// Acquire implements Journal.
func (j *SQLiteJournal) Acquire(ctx context.Context, key, owner string, lease time.Duration) (Record, error) {
	var out Record
	err := j.db.Write(ctx, true, func(tx *sqlitefile.Tx) error {
		id, stored, err := j.lockedGet(tx, key)
		if err != nil {
			return err
		}
		claimed, err := ApplyClaim(stored, owner, lease, j.now())
		if err != nil {
			out = stored
			return err
		}
		out = claimed
		return storeRecord(tx, id, claimed)
	})
	return out, err
}

// Renew implements Journal.
func (j *SQLiteJournal) Renew(ctx context.Context, owner string, lease time.Duration) (int, error) {
	var n int64
	err := j.db.Write(ctx, false, func(tx *sqlitefile.Tx) error {
		now := j.now()
		res, err := tx.Exec(`UPDATE operations SET lease_expires_at = ?
			WHERE state IN (1, 2, 3) AND lease_owner = ? AND lease_expires_at > ?`,
			millis(now.Add(lease)), owner, millis(now))
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return int(n), err
}

// Release implements Journal. A lost release only delays the next claim
// until the lease expires, so it does not wait for fsync.
func (j *SQLiteJournal) Release(ctx context.Context, key string, l Lease) error {
	return j.db.Write(ctx, false, func(tx *sqlitefile.Tx) error {
		id, stored, err := j.lockedGet(tx, key)
		if err != nil {
			return err
		}
		released, err := ApplyRelease(stored, l, j.now())
		if err != nil {
			return err
		}
		return storeRecord(tx, id, released)
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
			where, args = append(where, "scope = ?"), append(args, f.Scope)
		}
		if len(f.States) > 0 {
			marks := strings.Repeat(", ?", len(f.States))[2:]
			where = append(where, "state IN ("+marks+")")
			for _, s := range f.States {
				args = append(args, s)
			}
		}
		if !f.CreatedBefore.IsZero() {
			where, args = append(where, "created_at < ?"), append(args, millis(f.CreatedBefore))
		}
		q := `SELECT id, ` + recordColumns + ` FROM operations WHERE id > ?`
		for _, w := range where {
			q += " AND " + w
		}
		q += ` ORDER BY id LIMIT ` + fmt.Sprint(listPage)
		var after int64
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

func (j *SQLiteJournal) listPage(ctx context.Context, q string, args []any) ([]Record, int64, error) {
	if err := j.db.ErrIfClosed(); err != nil {
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
		rec, err := scanRecord(rows, &id)
		if err != nil {
			return nil, 0, j.db.Classify(err)
		}
		page = append(page, rec)
	}
	return page, id, j.db.Classify(rows.Err())
}

// Count implements Journal.
func (j *SQLiteJournal) Count(ctx context.Context) ([]Count, error) {
	if err := j.db.ErrIfClosed(); err != nil {
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
		c.Oldest = fromMillis(oldest)
		out = append(out, c)
	}
	return out, j.db.Classify(rows.Err())
}

// History implements Journal.
func (j *SQLiteJournal) History(ctx context.Context, key string) ([]Event, error) {
	if err := j.db.ErrIfClosed(); err != nil {
		return nil, err
	}
	rows, err := j.db.Reader.QueryContext(ctx, `SELECT e.version, e.at, e.from_state, e.to_state, e.attempt,
		e.status, e.error, e.owner
		FROM operations o LEFT JOIN events e ON e.op = o.id WHERE o.key = ? ORDER BY e.version`, key)
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
		if err := rows.Scan(&version, &at, &from, &to, &attempt, &status, &msg, &owner); err != nil {
			return nil, j.db.Classify(err)
		}
		if !version.Valid {
			continue // a record without events: cannot happen, but reads as empty
		}
		out = append(out, Event{Version: version.Int64, At: fromMillis(at.Int64), From: State(from.Int64),
			To: State(to.Int64), Attempt: int(attempt.Int64), StatusCode: int(status.Int64),
			Error: msg.String, Owner: owner.String})
	}
	if err := rows.Err(); err != nil {
		return nil, j.db.Classify(err)
	}
	if !found {
		return nil, notFound("key " + key)
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
		err := j.db.Write(ctx, false, func(tx *sqlitefile.Tx) error {
			rows, err := tx.Query(`SELECT id FROM operations WHERE id > ? AND state IN (4, 5, 7) AND updated_at < ?
				ORDER BY id LIMIT ?`, after, millis(before), pruneChunk)
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

type scanner interface{ Scan(dest ...any) error }

// scanRecord reads recordColumns, preceded by the prefix destinations.
func scanRecord(s scanner, prefix ...any) (Record, error) {
	var r Record
	var header, respHeader, respBody []byte
	var leaseOwner, lastError, note sql.NullString
	var leaseExpires, respStatus, respReplayed, expires sql.NullInt64
	var next, created, updated int64
	dest := append(prefix, &r.Key, &r.Scope, &r.ID, &r.Method, &r.URL, &header, &r.Body, &r.Fingerprint,
		&r.State, &r.Attempts, &next, &leaseOwner, &r.Lease.Epoch, &leaseExpires, &respStatus, &respHeader,
		&respBody, &respReplayed, &lastError, &note, &created, &updated, &expires, &r.Version)
	if err := s.Scan(dest...); err != nil {
		return Record{}, err
	}
	var err error
	if r.Header, err = decodeHeader(header); err != nil {
		return Record{}, fmt.Errorf("%w: header of %s: %v", ErrJournalCorrupt, r.Key, err)
	}
	r.NextAttemptAt = fromMillis(next)
	r.Lease.Owner = leaseOwner.String
	r.Lease.ExpiresAt = fromMillis(leaseExpires.Int64)
	if respStatus.Valid {
		h, err := decodeHeader(respHeader)
		if err != nil {
			return Record{}, fmt.Errorf("%w: response header of %s: %v", ErrJournalCorrupt, r.Key, err)
		}
		r.Response = &Response{StatusCode: int(respStatus.Int64), Header: h, Body: respBody, Replayed: respReplayed.Int64 != 0}
	}
	r.LastError, r.Note = lastError.String, note.String
	r = CloneRecord(r) // normalizes empty bodies and headers to nil
	r.CreatedAt, r.UpdatedAt, r.ExpiresAt = fromMillis(created), fromMillis(updated), fromMillis(expires.Int64)
	return r, nil
}

func recordArgs(r Record) []any {
	var status, replayed any
	var respHeader, respBody []byte
	if r.Response != nil {
		status, replayed = r.Response.StatusCode, r.Response.Replayed
		respHeader, respBody = encodeHeader(r.Response.Header), nonNil(r.Response.Body)
	}
	return []any{r.Key, r.Scope, r.ID, r.Method, r.URL, encodeHeader(r.Header), nonNil(r.Body), r.Fingerprint,
		r.State, r.Attempts, millis(r.NextAttemptAt), nullString(r.Lease.Owner), r.Lease.Epoch,
		nullMillis(r.Lease.ExpiresAt), status, respHeader, respBody, replayed, nullString(r.LastError),
		nullString(r.Note), millis(r.CreatedAt), millis(r.UpdatedAt), nullMillis(r.ExpiresAt), r.Version}
}

// nonNil keeps an empty body distinct from NULL.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

func encodeHeader(h map[string][]string) []byte {
	if len(h) == 0 {
		return nil
	}
	b, _ := json.Marshal(h) // a map of string slices always marshals
	return b
}

func decodeHeader(b []byte) (map[string][]string, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var h map[string][]string
	err := json.Unmarshal(b, &h)
	return h, err
}

func millis(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func nullMillis(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMilli()
}

func fromMillis(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}
