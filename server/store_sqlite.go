package server

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/idemkit/idem/internal/sqlitefile"
	"github.com/idemkit/idem/internal/wire"
)

// Errors from opening or using an SQLite store, matched with errors.Is. They
// come as a *FileError naming the path and what to do.
var (
	// ErrNotStore: the file is not an idem key store: another program's
	// SQLite database, an idem journal, or not SQLite at all.
	ErrNotStore = sqlitefile.ErrForeign
	// ErrSchemaTooNew: the store was written by a newer idem.
	ErrSchemaTooNew = sqlitefile.ErrSchemaTooNew
	// ErrStoreLocked: another process held the store's lock for longer
	// than the busy timeout (SQLiteBusyTimeout).
	ErrStoreLocked = sqlitefile.ErrLocked
	// ErrStoreHardLinks: the store file has another name (a hard link)
	// than the path given. SQLite keeps the -wal and -shm beside the name
	// it opens, so processes using two names would not see each other's
	// claims; the message names the others found beside it. Nothing was
	// changed. A symbolic link to the file is fine.
	ErrStoreHardLinks = sqlitefile.ErrHardLinks
	// ErrStoreClosed: the store was closed.
	ErrStoreClosed = errors.New("idem key store closed")
)

// FileError is a failure tied to a store file: its path, the kind of
// failure (ErrNotStore, ErrSchemaTooNew, or a file-system kind), the cause
// and a hint.
type FileError = sqlitefile.Error

// storeAppID marks a file as an idem server key store ("idms").
const storeAppID = sqlitefile.StoreAppID

// storeSchema[i] migrates the store's schema from version i to i+1.
var storeSchema = []string{
	`CREATE TABLE entries (
		id          INTEGER PRIMARY KEY,
		scope       TEXT NOT NULL,
		key         TEXT NOT NULL,
		fingerprint TEXT NOT NULL,
		method      TEXT NOT NULL,
		path        TEXT NOT NULL,
		state       INTEGER NOT NULL,
		token       INTEGER NOT NULL,
		created_at  INTEGER NOT NULL,
		locked_at   INTEGER NOT NULL,
		expires_at  INTEGER NOT NULL,
		resp_status INTEGER,
		resp_header BLOB,
		resp_body   BLOB,
		UNIQUE (scope, key)
	);
	CREATE INDEX entries_expiry ON entries (expires_at);`,
}

// SQLiteStore is a Store in one SQLite file (WAL mode, file mode 0600),
// shared by every process on the machine that opens the same file; entries
// survive restarts and crashes. It is safe for concurrent use.
//
// # Durability
//
// A claim returns only once it is on disk (synchronous=FULL, one fsync
// shared by every claim committed in the same group commit): a request is
// never executed under a claim that a power failure could erase.
//
// A completion is durable as well by default, so that a response is on
// disk before its first byte is sent: any answer a client could have seen
// is replayable even after a power failure. With SQLiteDeferCompletes a
// completion returns once committed, before its fsync (it reaches the disk
// within a second, or with the next claim). A process crash loses nothing
// either way; a power failure in that second loses the stored response and
// leaves the entry in progress, so once its lock goes stale a retry runs the
// handler again, and only the application's own guard (see KeyFromContext)
// keeps that from acting twice. Releases, lock renewals and sweeps never
// wait for fsync: losing one only delays a retry.
type SQLiteStore struct {
	db             *sqlitefile.DB
	deferCompletes bool
}

var _ Store = (*SQLiteStore)(nil)

// An SQLiteOption configures OpenSQLiteStore.
type SQLiteOption func(*sqliteStoreConfig)

type sqliteStoreConfig struct {
	file           sqlitefile.Options
	deferCompletes bool
}

// SQLiteDeferCompletes commits completions without waiting for fsync; see
// SQLiteStore for what a power failure then costs.
func SQLiteDeferCompletes() SQLiteOption {
	return func(c *sqliteStoreConfig) { c.deferCompletes = true }
}

// SQLiteBusyTimeout sets how long a write waits for another process's lock
// on the file. Defaults to 10 s.
func SQLiteBusyTimeout(d time.Duration) SQLiteOption {
	return func(c *sqliteStoreConfig) { c.file.BusyTimeout = d }
}

// SQLiteReaders sets the number of read connections (status queries and
// lookups). Defaults to 4.
func SQLiteReaders(n int) SQLiteOption {
	return func(c *sqliteStoreConfig) { c.file.Readers = n }
}

// OpenSQLiteStore opens the key store at path, creating it (mode 0600) when
// it does not exist and migrating an older schema. It refuses, changing
// nothing, a directory, a missing or unwritable directory, a file that is
// not an idem key store (ErrNotStore), a store written by a newer idem
// (ErrSchemaTooNew) and a file with another name, a hard link
// (ErrStoreHardLinks); the error names the path and what to do. A symbolic
// link to the file is fine.
func OpenSQLiteStore(path string, opts ...SQLiteOption) (*SQLiteStore, error) {
	var cfg sqliteStoreConfig
	for _, o := range opts {
		o(&cfg)
	}
	cfg.file.What = "key store"
	cfg.file.AppID = storeAppID
	cfg.file.Migrations = storeSchema
	cfg.file.Closed = ErrStoreClosed
	db, err := sqlitefile.Open(context.Background(), path, cfg.file)
	if err != nil {
		return nil, err
	}
	return &SQLiteStore{db: db, deferCompletes: cfg.deferCompletes}, nil
}

// Path returns the store file's absolute path, with symbolic links
// resolved: the file SQLite writes, beside which its -wal and -shm are.
func (s *SQLiteStore) Path() string { return s.db.Path() }

// Close makes every deferred write durable and closes the file. Calls after
// Close fail with ErrStoreClosed.
func (s *SQLiteStore) Close() error { return s.db.Close() }

const entryColumns = `scope, key, fingerprint, method, path, state, token, created_at, locked_at,
	expires_at, resp_status, resp_header, resp_body`

type rowScanner interface{ Scan(...any) error }

func scanEntry(row rowScanner) (Entry, error) {
	var (
		e                        Entry
		created, locked, expires int64
		status                   sql.NullInt64
		header, body             []byte
	)
	err := row.Scan(&e.Scope, &e.Key, &e.Fingerprint, &e.Method, &e.Path, &e.State, &e.Token,
		&created, &locked, &expires, &status, &header, &body)
	if err != nil {
		return Entry{}, err
	}
	e.CreatedAt, e.LockedAt, e.ExpiresAt = fromNanos(created), fromNanos(locked), fromNanos(expires)
	if status.Valid {
		r := &StoredResponse{Status: int(status.Int64), Body: body}
		if r.Body == nil {
			r.Body = []byte{}
		}
		var err error
		if r.Header, err = wire.DecodeHeader(header); err != nil {
			return Entry{}, fmt.Errorf("stored response header of key %q does not parse: %w", e.Key, err)
		}
		e.Response = r
	}
	return e, nil
}

func nanos(t time.Time) int64     { return t.UnixNano() }
func fromNanos(n int64) time.Time { return time.Unix(0, n) }
func newToken() int64             { return rand.Int64N(1<<62) + 1 }

// Claim implements Store.
func (s *SQLiteStore) Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
	var res ClaimResult
	err := s.db.Write(ctx, sqlitefile.Durable, func(tx *sqlitefile.Tx) error {
		res = ClaimResult{}
		e, err := scanEntry(tx.QueryRow(`SELECT `+entryColumns+` FROM entries WHERE scope = ? AND key = ?`, req.Scope, req.Key))
		switch {
		case errors.Is(err, sql.ErrNoRows) || (err == nil && e.expired(req.Now)):
			// Tokens are random rather than counted so that a key released
			// and claimed again never hands an old holder its token back.
			e = Entry{
				Scope: req.Scope, Key: req.Key, Fingerprint: req.Fingerprint,
				Method: req.Method, Path: req.Path, State: InProgress, Token: newToken(),
				CreatedAt: req.Now, LockedAt: req.Now, ExpiresAt: req.ExpiresAt,
			}
			_, err := tx.Exec(`INSERT OR REPLACE INTO entries (`+entryColumns+`)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, NULL)`,
				e.Scope, e.Key, e.Fingerprint, e.Method, e.Path, e.State, e.Token,
				nanos(e.CreatedAt), nanos(e.LockedAt), nanos(e.ExpiresAt))
			if err != nil {
				return err
			}
			res = ClaimResult{Claimed: true, Token: e.Token, Entry: e}
			return nil
		case err != nil:
			return err
		case e.takeable(&req):
			token := newToken()
			for token == e.Token {
				token = newToken()
			}
			e.Token, e.LockedAt, e.ExpiresAt = token, req.Now, later(e.ExpiresAt, req.ExpiresAt)
			_, err := tx.Exec(`UPDATE entries SET token = ?, locked_at = ?, expires_at = ? WHERE scope = ? AND key = ?`,
				e.Token, nanos(e.LockedAt), nanos(e.ExpiresAt), e.Scope, e.Key)
			if err != nil {
				return err
			}
			res = ClaimResult{Claimed: true, TookOver: true, Token: e.Token, Entry: e}
			return nil
		}
		res = ClaimResult{Entry: e}
		return nil
	})
	if err != nil {
		return ClaimResult{}, err
	}
	return res, nil
}

// Complete implements Store.
func (s *SQLiteStore) Complete(ctx context.Context, req CompleteRequest) error {
	if req.Response == nil {
		return errors.New("idem key store: Complete without a response")
	}
	body := req.Response.Body
	if body == nil {
		body = []byte{}
	}
	header := wire.EncodeHeader(req.Response.Header)
	return s.db.Write(ctx, s.completeMode(), func(tx *sqlitefile.Tx) error {
		res, err := tx.Exec(`UPDATE entries SET state = ?, expires_at = ?, resp_status = ?, resp_header = ?, resp_body = ?
			WHERE scope = ? AND key = ? AND token = ? AND state = ?`,
			Completed, nanos(req.ExpiresAt), req.Response.Status, header, body,
			req.Scope, req.Key, req.Token, InProgress)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n > 0 {
			return err
		}
		// The same completion again (the first one's reply was lost)
		// finds its own response under its token, and succeeds.
		var same int
		err = tx.QueryRow(`SELECT count(*) FROM entries WHERE scope = ? AND key = ? AND token = ? AND state = ?
			AND resp_status = ? AND resp_header IS ? AND resp_body = ?`,
			req.Scope, req.Key, req.Token, Completed, req.Response.Status, header, body).Scan(&same)
		if err != nil {
			return err
		}
		if same == 0 {
			return ErrLockLost
		}
		return nil
	})
}

func (s *SQLiteStore) completeMode() sqlitefile.Mode {
	if s.deferCompletes {
		return sqlitefile.Deferred
	}
	return sqlitefile.Durable
}

// Release implements Store.
func (s *SQLiteStore) Release(ctx context.Context, scope, key string, token int64) error {
	return s.fenced(ctx, sqlitefile.Deferred, func(tx *sqlitefile.Tx) (sql.Result, error) {
		return tx.Exec(`DELETE FROM entries WHERE scope = ? AND key = ? AND token = ? AND state = ?`,
			scope, key, token, InProgress)
	})
}

// Renew implements Store.
func (s *SQLiteStore) Renew(ctx context.Context, scope, key string, token int64, now time.Time) error {
	return s.fenced(ctx, sqlitefile.Deferred, func(tx *sqlitefile.Tx) (sql.Result, error) {
		return tx.Exec(`UPDATE entries SET locked_at = ? WHERE scope = ? AND key = ? AND token = ? AND state = ?`,
			nanos(now), scope, key, token, InProgress)
	})
}

// fenced runs a write that applies only while a token holds an entry's
// lock, and reports ErrLockLost when it changed no row.
func (s *SQLiteStore) fenced(ctx context.Context, mode sqlitefile.Mode, stmt func(*sqlitefile.Tx) (sql.Result, error)) error {
	return s.db.Write(ctx, mode, func(tx *sqlitefile.Tx) error {
		res, err := stmt(tx)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		if n == 0 {
			return ErrLockLost
		}
		return nil
	})
}

// Get implements Store.
func (s *SQLiteStore) Get(ctx context.Context, scope, key string, now time.Time) (Entry, error) {
	if err := s.db.ErrIfClosed(); err != nil {
		return Entry{}, err
	}
	e, err := scanEntry(s.db.Reader.QueryRowContext(ctx,
		`SELECT `+entryColumns+` FROM entries WHERE scope = ? AND key = ? AND expires_at > ?`, scope, key, nanos(now)))
	if errors.Is(err, sql.ErrNoRows) {
		return Entry{}, ErrNotFound
	}
	if err != nil {
		return Entry{}, s.db.Classify(err)
	}
	return e, nil
}

// sweepBatch bounds the rows one sweep transaction deletes, so that a sweep
// of a large backlog never holds claims up for long.
const sweepBatch = 500

// Sweep implements Store.
func (s *SQLiteStore) Sweep(ctx context.Context, now time.Time) (int, error) {
	total := 0
	for {
		var n int64
		err := s.db.Write(ctx, sqlitefile.Deferred, func(tx *sqlitefile.Tx) error {
			res, err := tx.Exec(`DELETE FROM entries WHERE id IN
				(SELECT id FROM entries WHERE expires_at <= ? LIMIT ?)`, nanos(now), sweepBatch)
			if err != nil {
				return err
			}
			n, err = res.RowsAffected()
			return err
		})
		total += int(n)
		if err != nil || n < sweepBatch {
			return total, err
		}
	}
}
