package sqlitefile

import (
	"errors"
	"fmt"
	"path/filepath"
	"syscall"

	"github.com/mattn/go-sqlite3"
)

// Kinds of failure, matched with errors.Is. The root package re-exports them
// under its own names.
var (
	// ErrForeign: the file is not one of ours (another program's SQLite
	// database, or not SQLite at all).
	ErrForeign = errors.New("not an idem file")
	// ErrSchemaTooNew: the file was written by a newer build.
	ErrSchemaTooNew = errors.New("schema is newer than this build supports")
	// ErrCorrupt: SQLite found the file damaged.
	ErrCorrupt = errors.New("file is corrupt")
	// ErrBadPath: the path cannot hold a database (a directory, a missing
	// parent, no permission to write).
	ErrBadPath = errors.New("unusable path")
	// ErrFull: the disk or the file system is full.
	ErrFull = errors.New("disk full")
	// ErrClosed: the database was closed.
	ErrClosed = errors.New("closed")
	// ErrHot: a file opened with Options.ReadOnly has a hot rollback
	// journal beside it (a process ended while it wrote the file), which
	// only a connection that may write plays back.
	ErrHot = errors.New("left mid-write by a process that ended")
	// ErrLocked: another process held a lock on the file for longer than
	// Options.BusyTimeout (an sqlite3 shell or a backup tool left in a
	// transaction, or a process stopped while it held the lock).
	ErrLocked = errors.New("locked by another process")
	// ErrHardLinks: the file has another name (a hard link) than the one
	// it was opened by; SQLite would keep a WAL beside each (see
	// checkNames).
	ErrHardLinks = errors.New("has more than one name")
)

// Application IDs of idem's kinds of file. They are listed here, in one
// place, so that a file opened as the wrong kind (the server's key store
// given as a journal) is named for what it is, not taken for another
// program's.
const (
	JournalAppID int32 = 0x69646d6a // "idmj"
	StoreAppID   int32 = 0x69646d73 // "idms"
)

var kinds = map[int32]struct{ what, whose, hint string }{
	JournalAppID: {"journal", "a client's", "this one is opened by idem.OpenSQLite and the idem command's --journal"},
	StoreAppID:   {"key store", "the server's", "this one is opened by server.OpenSQLiteStore"},
}

// Error is a failure tied to one file. It says what went wrong and what to
// do about it, and matches its Kind and its cause with errors.Is.
type Error struct {
	// What names the file's role, such as "journal".
	What string
	Path string
	// Kind is one of the Err values of this package.
	Kind error
	// Err is the underlying cause, if any.
	Err error
	// Hint says what to do.
	Hint string
}

func (e *Error) Error() string {
	kind := e.Kind.Error()
	if e.Kind == ErrForeign {
		kind = "not an idem " + e.What
	}
	msg := fmt.Sprintf("idem %s %s: %s", e.What, e.Path, kind)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	if e.Hint != "" {
		msg += "; " + e.Hint
	}
	return msg
}

// Unwrap returns the kind and the cause.
func (e *Error) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Err}
}

// classify turns an SQLite or file-system failure into an *Error when it is
// one of the kinds a caller must act on, and returns err unchanged
// otherwise.
func (db *DB) classify(err error) error {
	if err == nil {
		return nil
	}
	var fe *Error
	if errors.As(err, &fe) {
		return err
	}
	var se sqlite3.Error
	if errors.As(err, &se) {
		switch se.Code {
		case sqlite3.ErrCorrupt:
			return &Error{What: db.what, Path: db.path, Kind: ErrCorrupt, Err: err,
				Hint: "stop every process using it, move it aside and restore a backup; idem never repairs a file"}
		case sqlite3.ErrNotADB:
			return &Error{What: db.what, Path: db.path, Kind: ErrForeign, Err: err,
				Hint: "the file is not an SQLite database or its header is damaged; check the path"}
		case sqlite3.ErrFull:
			return &Error{What: db.what, Path: db.path, Kind: ErrFull, Err: err,
				Hint: "free space on the file system; nothing was written by the failed call"}
		case sqlite3.ErrReadonly, sqlite3.ErrPerm, sqlite3.ErrCantOpen:
			if se.ExtendedCode == sqlite3.ErrReadonlyRollback {
				return &Error{What: db.what, Path: db.path, Kind: ErrHot,
					Err:  fmt.Errorf("a rollback journal (%s-journal) holds its last, unfinished write", filepath.Base(db.path)),
					Hint: "a read-only open leaves both files as they are; opening it for writing rolls the write back"}
			}
			return &Error{What: db.what, Path: db.path, Kind: ErrBadPath, Err: err,
				Hint: "the file or its directory is not writable by this process; check ownership and permissions"}
		case sqlite3.ErrIoErr:
			if noSpace(se.SystemErrno) {
				return &Error{What: db.what, Path: db.path, Kind: ErrFull, Err: err,
					Hint: "free space on the file system; nothing was written by the failed call"}
			}
		}
	}
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.Is(err, syscall.EFBIG) {
		return &Error{What: db.what, Path: db.path, Kind: ErrFull, Err: err,
			Hint: "free space on the file system; nothing was written by the failed call"}
	}
	return err
}

// noSpace reports the errors a write gets when the file cannot grow: the
// file system is full, the quota is spent, or the file hit its size limit.
func noSpace(errno syscall.Errno) bool {
	return errno == syscall.ENOSPC || errno == syscall.EDQUOT || errno == syscall.EFBIG
}

// locked reports err, SQLite's busy failure after waiting BusyTimeout for
// the lock (the write lock, or any lock while the file is opened), as an
// ErrLocked that says what to do.
func (db *DB) locked(lock string, err error) error {
	return &Error{What: db.what, Path: db.path, Kind: ErrLocked,
		Err: fmt.Errorf("waited %s for %s: %w", db.opts.BusyTimeout, lock, err),
		Hint: fmt.Sprintf("find the process that holds it (fuser %s) and end its transaction, or let writes wait longer (SQLiteBusyTimeout); nothing was written by the failed call",
			db.path)}
}

func isBusy(err error) bool {
	var se sqlite3.Error
	return errors.As(err, &se) && (se.Code == sqlite3.ErrBusy || se.Code == sqlite3.ErrLocked)
}
