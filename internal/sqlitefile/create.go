package sqlitefile

import (
	"context"
	"database/sql"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// resolve returns path, made absolute, with its symbolic links resolved:
// the path of the file SQLite reads and writes, beside which it keeps the
// -wal and -shm. Every name the package derives from the path (the WAL it
// fsyncs, the files beside it) must be derived from that one, whatever
// link a process was given. The path is read as the kernel reads it: a
// ".." after a link to a directory goes up from where the link points, so
// nothing is cleaned as text before its links are followed. A link whose
// target does not exist yet is followed to that target, which Open then
// creates (0600, as any new file); one whose target ends in "/" names a
// directory yet to be made, and is refused; a path that does not exist
// keeps its name, in its directory resolved, and prepareFile says what is
// missing.
func resolve(path string) (string, error) {
	const sep = string(filepath.Separator)
	if !filepath.IsAbs(path) {
		wd, err := os.Getwd()
		if err != nil {
			return "", err
		}
		path = wd + sep + path
	}
	for range 40 { // Linux's own limit on links followed in one lookup
		r, err := filepath.EvalSymlinks(path)
		if err == nil {
			return r, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		i := strings.LastIndex(path, sep)
		parent, base := path[:i+1], path[i+1:]
		switch base {
		case "":
			return "", errors.New("names a directory (it ends in " + sep + "), not a file")
		case ".", "..":
			return filepath.Clean(path), nil // a missing directory: prepareFile reports it
		}
		dir, err := filepath.EvalSymlinks(parent)
		if err != nil {
			return filepath.Clean(path), nil // a missing directory: prepareFile reports it
		}
		p := filepath.Join(dir, base)
		fi, err := os.Lstat(p)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			return p, nil // missing: the file to create
		}
		target, err := os.Readlink(p)
		if err != nil {
			return "", err
		}
		if !filepath.IsAbs(target) {
			target = dir + sep + target // not cleaned: see above
		}
		path = target
	}
	return "", errors.New("too many levels of symbolic links")
}

// create makes the missing file at db.path, whole: it builds the database
// under a private temporary name in the same directory (created 0600 and
// O_EXCL; SQLite gives the -journal, -wal and -shm the same mode), runs
// the migrations there and switches it to WAL, fsyncs it, then links it to
// db.path. So the path never names an empty or half-made file, which an
// opener that must not create one (a read-only tool) would refuse as not
// ours while it was being created; and no descriptor of the final path is
// ever opened and closed here, which would drop the POSIX locks that
// SQLite connections of this process hold on it (see canReadWrite). The
// link fails if the path exists: another process created it first, and
// its file is used. A process killed here leaves its temporary file (a
// name beginning with ".idem-new-"), never a damaged db.path; and one
// killed between the link and the removal leaves that name as a second
// link to the file itself, which is never opened as a database (SQLite
// names the -wal after the name it is given), and not counted as one of
// its names (see checkNames). Neither is removed by a later open: no open
// can tell a dead creator's file from a live one's, or from a file of the
// user's that happens to be named so.
func (db *DB) create(ctx context.Context, dir string) error {
	bad := func(err error) error {
		return &Error{What: db.what, Path: db.path, Kind: ErrBadPath, Err: err,
			Hint: "the directory must be writable by this process"}
	}
	// The directory is synced once the file is linked (below), which needs
	// it open for reading: a directory this process may write but not
	// read (mode 0300) is refused now, before anything is made in it,
	// rather than after the file is at its path.
	d, err := os.Open(dir)
	if err != nil {
		return &Error{What: db.what, Path: db.path, Kind: ErrBadPath, Err: err,
			Hint: "the directory must be readable and writable by this process (a new file is made under a temporary name, linked to its path, and the directory synced, which needs it open for reading)"}
	}
	defer d.Close()
	// A short name, not the file's own with a suffix: a name near the
	// file system's limit (255 bytes, the -wal's suffix included) must be
	// usable as it was before files were made this way.
	f, err := os.CreateTemp(dir, tempPrefix+"*")
	if err != nil {
		return bad(err)
	}
	tmp := f.Name()
	defer func() {
		for _, p := range []string{tmp, tmp + "-journal", tmp + "-wal", tmp + "-shm"} {
			_ = os.Remove(p)
		}
	}()
	if err := f.Close(); err != nil {
		return bad(err)
	}
	if err := db.initialize(ctx, tmp); err != nil {
		return err
	}
	// SQLite fsynced its commits; the header's switch to WAL is synced
	// here. Nothing else has this file open: closing it drops no lock.
	if f, err = os.OpenFile(tmp, os.O_RDWR, 0); err != nil {
		return bad(err)
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return db.classify(err)
	}
	if err := os.Link(tmp, db.path); err != nil && !errors.Is(err, fs.ErrExist) {
		return &Error{What: db.what, Path: db.path, Kind: ErrBadPath, Err: err,
			Hint: "the directory must be writable by this process, on a file system with hard links (the file is made under a temporary name, then linked to its path)"}
	}
	// The file's name must survive a power cut: SQLite fsyncs the
	// directory when it first syncs the WAL, but the journal does not rest
	// its first intent on that detail.
	if err := syncDir(d); err != nil {
		return bad(err)
	}
	return nil
}

// initialize migrates the new, empty database at tmp to the current schema
// and switches it to WAL, on a connection of its own that it closes: the
// migrations run in rollback mode (the file is no one else's yet), and the
// switch leaves the mark in the header, so that every opener of the final
// path finds it in WAL mode from the start. Its failures name db.path, the
// file being created.
func (db *DB) initialize(ctx context.Context, tmp string) (err error) {
	t := &DB{what: db.what, path: tmp, opts: db.opts}
	defer func() {
		if fe := (*Error)(nil); errors.As(err, &fe) {
			fe.Path = db.path
		}
	}()
	if t.writerDB, err = sql.Open("sqlite3", t.dsn()); err != nil {
		return t.openError(t.classify(err))
	}
	defer t.writerDB.Close()
	t.writerDB.SetMaxOpenConns(1)
	if t.writer, err = t.writerDB.Conn(ctx); err != nil {
		return t.openError(t.classify(err))
	}
	defer t.writer.Close()
	if err := t.migrate(ctx); err != nil {
		return t.openError(err)
	}
	if err := t.setWAL(ctx, t.writer); err != nil {
		return t.openError(err)
	}
	return nil
}
