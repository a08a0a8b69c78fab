package sqlitefile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// create makes the missing file at db.path without ever holding a
// descriptor of that path, which it would have to close, dropping the
// POSIX locks that SQLite connections of this process hold on the file
// once another handle has opened it (see canReadWrite): it creates a
// private temporary file in the same directory (0600 and O_EXCL; SQLite
// gives the -wal and -shm the same mode), fsyncs it, then links it to
// db.path. The link fails if the path exists: another process created it
// first, and its file is used. A process killed here leaves its temporary
// file (a name beginning with "." and the file's name), never a file at
// db.path that is not 0600.
func (db *DB) create(dir string) error {
	bad := func(err error) error {
		return &Error{What: db.what, Path: db.path, Kind: ErrBadPath, Err: err,
			Hint: "the directory must be writable by this process"}
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(db.path)+".new-*")
	if err != nil {
		return bad(err)
	}
	tmp := f.Name()
	defer func() {
		_ = os.Remove(tmp)
	}()
	// Nothing else has this file open: closing it drops no lock.
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return db.classify(err)
	}
	if err := os.Link(tmp, db.path); err != nil && !errors.Is(err, fs.ErrExist) {
		return bad(err)
	}
	// The file's name must survive a power cut: SQLite fsyncs the
	// directory when it first syncs the WAL, but the journal does not rest
	// its first intent on that detail.
	if err := syncDir(dir); err != nil {
		return bad(err)
	}
	return nil
}
