package sqlitefile

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// ErrReadOnly: a write to a file opened with Options.ReadOnly.
var ErrReadOnly = errors.New("opened read-only")

// ErrSchemaTooOld: a file opened with Options.ReadOnly has an older schema
// than this build's, which only opening it for writing migrates.
var ErrSchemaTooOld = errors.New("schema is older than this build's")

// noRollbackJournal reports whether there is no rollback journal beside
// the file at path. Only then is it opened read-write by openReadOnly: a
// connection that may write, finding a hot rollback journal (left by a
// process killed while it wrote the file in rollback mode, as an older
// build did when it created a journal), plays it back, rewriting or
// truncating the file and deleting the journal. One opened with mode=ro
// refuses instead (SQLITE_READONLY_ROLLBACK, ErrHot), at the first read
// and at every later one.
//
// The file's header is not read to tell WAL mode from rollback mode, as it
// once was: reading it means opening and closing a descriptor of the
// file, and closing any descriptor of a file drops every POSIX lock this
// process holds on it (see canReadWrite), such as the shared lock each
// WAL connection keeps on the database file, without which another
// process closing its last connection takes the WAL for unused and
// deletes it under this process's connections. What that costs: a file
// in rollback mode with no journal beside it is read read-write, and if a
// writer is killed mid-transaction while it is open, this reader plays
// the hot journal back as that writer's next opener would. Files this
// build creates are in WAL mode from the start (see create); only an
// older build's file, empty or mid-migration, is ever in rollback mode.
func noRollbackJournal(path string) bool {
	_, err := os.Lstat(path + "-journal")
	return errors.Is(err, fs.ErrNotExist)
}

// openReadOnly opens the file for reading only, for tools that inspect it
// while applications write it: the read pool alone, its connections
// query_only, so that no migration, no change of journal mode and no
// write of any kind can run. Nothing is created: a missing or empty file
// is refused. The connections open the file read-write nonetheless when
// the process may write it: a reader of a WAL file needs the -shm index,
// which SQLite creates when no one has the file open, and only a
// connection that may write removes it (and the empty -wal) when the last
// one closes, leaving the directory as it was. A file this process may
// not write, or with a rollback journal beside it (see noRollbackJournal),
// is opened with mode=ro.
func (db *DB) openReadOnly(ctx context.Context) error {
	bad := func(err error, hint string) error {
		return &Error{What: db.what, Path: db.path, Kind: ErrBadPath, Err: err, Hint: hint}
	}
	fi, err := os.Stat(db.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return bad(fs.ErrNotExist, "check the path; it is not created when it is missing")
	case err != nil:
		return bad(err, "check the path and its permissions")
	case fi.IsDir():
		return bad(errors.New("is a directory"), "give the path of a file inside it")
	case !fi.Mode().IsRegular():
		return bad(errors.New("is not a regular file"), "give the path of a regular file")
	case fi.Size() == 0 && !nonEmpty(db.path+"-wal"):
		return &Error{What: db.what, Path: db.path, Kind: ErrForeign, Err: errors.New("the file is empty"),
			Hint: "check the path; an empty file is not a " + db.what}
	}
	if err := db.checkNames(fi); err != nil {
		return err
	}
	db.readOnly = true
	extra := []string{"_query_only", "1"}
	if canReadWrite(db.path) != nil || !noRollbackJournal(db.path) {
		extra = append(extra, "mode", "ro")
	}
	if db.Reader, err = sql.Open("sqlite3", db.dsn(extra...)); err != nil {
		return db.openError(db.classify(err))
	}
	db.Reader.SetMaxOpenConns(db.opts.Readers)
	db.Reader.SetMaxIdleConns(db.opts.Readers)
	c, err := db.Reader.Conn(ctx)
	if err != nil {
		db.Reader.Close()
		return db.openError(db.classify(err))
	}
	version, err := db.identity(ctx, c)
	c.Close()
	switch {
	case err != nil:
		db.Reader.Close()
		return db.openError(err)
	case version == 0:
		db.Reader.Close()
		return &Error{What: db.what, Path: db.path, Kind: ErrForeign, Err: errors.New("an SQLite database without tables"),
			Hint: "check the path"}
	case version < len(db.opts.Migrations):
		db.Reader.Close()
		return &Error{What: db.what, Path: db.path, Kind: ErrSchemaTooOld,
			Err:  fmt.Errorf("schema version %d, this build reads version %d", version, len(db.opts.Migrations)),
			Hint: "opening it read-only does not migrate it; open it for writing to migrate it in place"}
	}
	return nil
}

// errIfReadOnly refuses a write to a file opened read-only.
func (db *DB) errIfReadOnly() error {
	if db.readOnly {
		return &Error{What: db.what, Path: db.path, Kind: ErrReadOnly}
	}
	return nil
}

// ReadOnly reports whether the file was opened with Options.ReadOnly.
func (db *DB) ReadOnly() bool { return db.readOnly }
